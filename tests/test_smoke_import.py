def test_import():
    import dphub.cli.main  # noqa: F401

