"""The autoscaler: `planner` decides each role's pod count from the registry's load (a pure policy, configured by
`config`); `metrics` counts and logs each decision."""
