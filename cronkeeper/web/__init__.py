"""``cronkeeper web``: the audit as a picture (SPEC §13). Needs the ``web`` extra (Flask,
waitress); the daemon's install does not."""
