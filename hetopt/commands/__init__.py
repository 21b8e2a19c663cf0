"""The `hetopt` commands, one module per group; hetopt.cli registers them on its typer app."""
