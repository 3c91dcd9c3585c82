"""``flask --app wsgi drill ...``: areas add their drills to this group."""
from flask.cli import AppGroup

drill_cli = AppGroup("drill", help="Chaos drills (results are kept on the Drills page)")
