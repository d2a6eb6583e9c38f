"""Online workloads, through the router of a real cluster (`cli`): W2-online, W5, W7, W8, W9, with the load driver,
the arrivals, the colocated baseline and the router's CPU and gRPC floor figures."""
