"""One module per command group; replay.cli registers them."""
