"""Console WSGI entry point: ``gunicorn wsgi:app`` / ``flask --app wsgi ...``."""
from app.factory import create_app

app = create_app()
