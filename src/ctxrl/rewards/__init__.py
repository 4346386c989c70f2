"""Success, prefix-reuse cost, the success-gated efficiency advantage, and edit masks."""
