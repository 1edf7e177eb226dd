pytest_plugins = ["kvscale_cluster.fixtures"]
