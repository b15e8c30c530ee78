"""Room for the user test harness (pytest plugin, trio API, fault hooks)."""
