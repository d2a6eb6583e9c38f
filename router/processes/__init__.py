"""A router served by several processes (`pdserve router --workers N`): their supervisor (`supervisor`) and each
worker's entry point (`worker`), which process this one is (`router_process`), the counts table they share
(`shared_counts`) and Abort forwarded between them (`sibling_aborts`)."""
