"""atheris harnesses of the bookie's input paths (``nox -s fuzz``); see README.md."""
