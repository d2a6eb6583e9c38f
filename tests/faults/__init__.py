"""Fault tests over real processes: overload and cancellation (test_overload.py, test_cancel_storm.py)."""
