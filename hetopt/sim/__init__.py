"""Discrete-event replay of a placed plan on the device graph under dynamic bandwidth
(docs/simulator.md)."""
