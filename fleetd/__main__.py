from fleetd.cli.main import app

app(prog_name="fleetd")
