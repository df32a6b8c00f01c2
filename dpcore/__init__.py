"""Framework-free core of dprelease: accountants, calibration and mechanisms.

Nothing here imports FastAPI, Celery or SQLAlchemy, so researchers can use and audit it alone.
"""
