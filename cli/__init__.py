"""The product's drivers: the `pdserve` command, the local cluster launcher, the throwaway Redis server and the
Python client."""
