"""The CLI."""
from fleetd.cli.entry import main

main()
