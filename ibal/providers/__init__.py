"""Provider plugins shipped with ibal."""
