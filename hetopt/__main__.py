"""`python -m hetopt` is the `hetopt` command."""

from hetopt.cli import main

main()
