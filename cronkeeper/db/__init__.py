"""The only package that imports sqlalchemy or psycopg: tables, one function per statement,
migrations and engines."""
