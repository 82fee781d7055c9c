"""`dphub` commands of the card group (placeholder until implemented)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
