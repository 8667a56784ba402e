"""``cronkeeper web``: the audit as a picture (docs/web.md). Needs the ``web`` extra (Flask,
waitress); the daemon's install does not."""
