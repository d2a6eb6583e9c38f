"""Small pieces shared by every pdserve service: config helpers, block hashing, Redis clients."""
