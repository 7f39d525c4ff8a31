"""Model repositories: discovery, version policy, loading, states and lookup."""
