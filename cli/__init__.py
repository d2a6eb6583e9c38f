"""The product's drivers: the `pdserve` command, the local cluster launcher and the throwaway Redis server (the
Python client is the package `client`, the autoscaler the package `autoscaler`)."""
