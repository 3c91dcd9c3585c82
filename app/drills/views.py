"""Console pages and admin API routes of the drills area."""
from flask import Blueprint

bp = Blueprint("drills", __name__)
