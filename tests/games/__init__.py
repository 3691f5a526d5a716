"""Tests of fleetd/games/: the game spec, the fleet file, the catalog, the games API."""
