"""Command-line tools that talk to an endpoint over HTTP: `kvscale loadtest`."""
