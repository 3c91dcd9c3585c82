"""Console pages and admin API routes of the finops area."""
from flask import Blueprint

bp = Blueprint("finops", __name__)
