"""The tiered-storage offloader: which segments go to the object store and when
(:mod:`.policy`), the copy-verify-record-delete protocol (:mod:`.offloader`), and
the service that runs it beside a bookie or on its own (:mod:`.service`).  What it
writes and how readers read it back is :mod:`asyncbk.tiered`."""
