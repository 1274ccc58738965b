"""The reference tables of the docs match the code they describe: wire ops, their
fields, flags and status codes (docs/protocol.md), journal record types
(docs/storage.md and the journal_format docstring), format versions, the Spark
source's options, schemas and limits (docs/spark.md), and every bookie and client
setting with its default (docs/configuration.md)."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from asyncbk.bookie import journal_format
from asyncbk.bookie.cookie import COOKIE_FORMAT
from asyncbk.bookie.storage import CHECKPOINT_VERSION
from asyncbk.client.ledger import FRAME_OVERHEAD_BYTES_MAX
from asyncbk.meta.model import METADATA_FORMAT_VERSION
from asyncbk.net.adds import ADD_BATCH_BYTES_MAX, ADD_BATCH_ENTRIES_MAX
from asyncbk.proto import messages
from asyncbk.proto.messages import PROTOCOL_VERSION, AddFlag, Op, ReadFlag, Status

DOCS = Path(__file__).resolve().parents[2] / "docs"


def table(text: str, header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the markdown table whose header row starts
    with ``header``; fails if there is no such table or it is empty."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header):
            rows = []
            for row in lines[i + 2:]:  # past the header and the |---| line
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            assert rows, f"the table under {header!r} is empty"
            return rows
    raise AssertionError(f"no table with header {header!r}")


def name(cell: str) -> str:
    """`ADD` -> ADD; `master_key: bytes` -> master_key."""
    return cell.split(":")[0].strip().strip("`")


def protocol() -> str:
    return (DOCS / "protocol.md").read_text()


def test_protocol_op_table_matches_the_op_enum() -> None:
    rows = table(protocol(), "| op | code |")
    documented = [(name(r[0]), int(r[1])) for r in rows]
    assert len(documented) == len(set(documented)), "an op is documented twice"
    assert sorted(documented, key=lambda x: x[1]) == [(op.name, op.value) for op in Op]


def _field_names(cell: str) -> list[str]:
    """The fields of a cell, an optional one (in brackets) as ``[name]``."""
    if cell == "(none)":
        return []
    out = []
    for c in cell.split(", "):
        optional = c.startswith("[") and c.endswith("]")
        out.append(f"[{name(c[1:-1])}]" if optional else name(c))
    return out


def _wire_fields(cls: type) -> list[str]:
    """``cls``'s fields after request_id (and status), optional ones as ``[name]``."""
    return [f"[{f.name}]" if f.default is not MISSING or f.default_factory is not MISSING
            else f.name for f in fields(cls)]


def test_protocol_op_table_lists_each_messages_fields_in_wire_order() -> None:
    requests = {cls.OP: cls for cls in messages._REQUESTS.values()}
    responses = {cls.OP: cls for cls in messages._RESPONSES.values()}
    for row in table(protocol(), "| op | code |"):
        op = Op[name(row[0])]
        want_req = _wire_fields(requests[op])[1:]  # after request_id
        want_resp = _wire_fields(responses[op])[2:]  # after request_id, status
        assert _field_names(row[2]) == want_req, f"{op.name} request fields"
        assert _field_names(row[3]) == want_resp, f"{op.name} response fields"


def test_protocol_status_table_matches_the_status_enum() -> None:
    rows = table(protocol(), "| code | name |")
    documented = [(name(r[1]), int(r[0])) for r in rows]
    assert documented == [(s.name, s.value) for s in Status]


def test_protocol_flag_table_matches_the_flag_enums() -> None:
    rows = table(protocol(), "| op | flag | value |")
    documented = {(r[0], name(r[1]), int(r[2])) for r in rows}
    expected = {("ADD", f.name, f.value) for f in AddFlag if f.value} | \
        {("READ", f.name, f.value) for f in ReadFlag if f.value}
    assert documented == expected


def test_protocol_version_and_size_limits_are_the_codes() -> None:
    text = protocol()
    assert f"protocol version **{PROTOCOL_VERSION}**" in text
    assert "`EntryTooLargeError`" in text  # the client refuses oversized appends
    assert f"`frame_bytes_max` less {FRAME_OVERHEAD_BYTES_MAX} bytes" in text
    assert f"at most {ADD_BATCH_ENTRIES_MAX} entries" in text
    assert f"at most {ADD_BATCH_BYTES_MAX // 2**20} MiB of bodies" in text
    assert "half its `frame_bytes_max`" in text


def _journal_types() -> list[tuple[str, int]]:
    return sorted(((n.removeprefix("TYPE_"), v) for n, v in vars(journal_format).items()
                   if n.startswith("TYPE_")), key=lambda x: x[1])


def test_storage_doc_lists_every_journal_record_type() -> None:
    rows = table((DOCS / "storage.md").read_text(), "| type | name | payload |")
    assert [(name(r[1]), int(r[0])) for r in rows] == _journal_types()


def test_journal_format_docstring_lists_every_record_type() -> None:
    doc = journal_format.__doc__ or ""
    rows = re.findall(r"^(\d+)\s+([A-Z_]+)\s", doc, re.MULTILINE)
    assert [(n, int(t)) for t, n in rows] == _journal_types()


def test_storage_doc_names_the_format_versions() -> None:
    text = (DOCS / "storage.md").read_text()
    assert [r[1] for r in table(text, "| key | meaning |") if r[0] == "`version`"] == \
        [f"`{CHECKPOINT_VERSION}`"]


def test_deploy_doc_names_the_format_versions() -> None:
    rows = table((DOCS / "deploy.md").read_text(), "| format | version field |")
    current = {r[0]: r[2] for r in rows}
    assert current["wire protocol"] == f"protocol version {PROTOCOL_VERSION}"
    assert current["checkpoint (`ledger_dir/checkpoint`)"] == \
        f"checkpoint version {CHECKPOINT_VERSION}"
    assert current["cookie (`COOKIE`, and in etcd)"] == f"cookie format {COOKIE_FORMAT}"
    assert current["ledger metadata (etcd)"] == str(METADATA_FORMAT_VERSION)
    unversioned = current["journal, entry logs, `index.log`"]
    assert unversioned == "—"  # no version field: the doc says what holds instead


def _spark_options() -> set[str]:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from asyncbk.spark.options import KNOWN

    return KNOWN - {"path"}  # what load(x)/save(x) set: documented with `stream`


def test_spark_doc_option_table_matches_the_known_options() -> None:
    rows = table((DOCS / "spark.md").read_text(), "| option | applies to |")
    documented = [name(r[0]) for r in rows]
    assert len(documented) == len(set(documented)), "an option is documented twice"
    assert {d.lower() for d in documented} == _spark_options()


def test_spark_doc_names_the_schemas_defaults_and_limits() -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from asyncbk.spark import LEDGER_SCHEMA, STREAM_SCHEMA, STREAM_SCHEMA_WITH_HEADERS
    from asyncbk.spark.options import MAX_RECORDS_PER_PARTITION, OPERATION_TIMEOUT_S
    from asyncbk.stream.adopt import ADOPT_LEDGERS_MAX

    text = (DOCS / "spark.md").read_text()
    schemas = {r[1] for r in table(text, "| read of | schema |")}
    assert schemas == {f"`{STREAM_SCHEMA}`", f"`{STREAM_SCHEMA_WITH_HEADERS}`",
                       f"`{LEDGER_SCHEMA}`"}
    defaults = {name(r[0]): r[2] for r in table(text, "| option | applies to |")}
    assert defaults["maxRecordsPerPartition"] == f"`{MAX_RECORDS_PER_PARTITION}`"
    assert defaults["operationTimeoutS"] == f"`{OPERATION_TIMEOUT_S:g}`"
    assert f"one commit adopts at most {ADOPT_LEDGERS_MAX}" in " ".join(text.split())


def _doc_default(cell: str) -> object:
    """A default as the settings tables write it: `3181`, 8388608 (8 MiB), 0.95,
    `true`, `"memory"`, 127.0.0.1, `""` → `host`; None for "— (required)"."""
    text = cell.replace("`", "").split(" (")[0].split(" →")[0].strip()
    if text.startswith("—"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if text in ("{}", "[]"):
        return {} if text == "{}" else []
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text.strip('"')


def _setting_rows(section: str) -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([a-z0-9_]+)` \| ([^|]*) \|", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is in two rows"
            rows[m.group(1)] = m.group(2).strip()
    return rows


@pytest.mark.parametrize("which", ["bookie", "client"])
def test_configuration_doc_gives_every_setting_with_the_codes_default(which: str) -> None:
    from asyncbk.config import BookieConfig, ClientConfig

    text = (DOCS / "configuration.md").read_text()
    bookie_part, client_part = text.split("## Client settings", 1)
    cls, part = ((BookieConfig, bookie_part.split("## Bookie settings", 1)[1])
                 if which == "bookie" else (ClientConfig, client_part))
    rows = _setting_rows(part)
    by_name = {f.name: f for f in fields(cls)}
    assert sorted(set(by_name) - set(rows)) == [], "settings the doc does not list"
    assert sorted(set(rows) - set(by_name)) == [], "rows naming no setting"
    wrong = {}
    for field_name, cell in rows.items():
        documented = _doc_default(cell)
        if documented is None:
            continue
        f = by_name[field_name]
        actual = f.default if f.default_factory is MISSING else f.default_factory()
        if isinstance(actual, float) and not isinstance(documented, bool):
            ok = isinstance(documented, int | float) and float(documented) == actual
        else:
            ok = documented == actual
        if not ok:
            wrong[field_name] = (cell, actual)
    assert wrong == {}, "doc default != code default"
