"""What an operator can ask or do, as plain functions returning values: ``cli/`` and ``web/``
only render them. (The layer grows here as commands move out of ``cli/``.)"""
