"""Attention backends behind one interface, chosen once at start-up."""
