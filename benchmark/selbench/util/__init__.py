"""Foundation: helpers every layer may use (atomic file writes, the table of moved module
paths). Owns no selbench concept and imports nothing of selbench outside this package."""
