"""Console pages and admin API routes of the pools area."""
from flask import Blueprint

bp = Blueprint("pools", __name__)
