"""Every ``ctxrl`` subcommand's implementation: the top layer, above env, rewards, train and evolve."""
