"""Re-planning when the network changes: what a switch of plans moves (`migration`), switch or
stay for one change (`decide`), and the adaptive policy that decides at every change a replay sees
(`policy`)."""
