"""The dphub command line (installed as ``dphub.cli``): thin Typer commands over the library."""
