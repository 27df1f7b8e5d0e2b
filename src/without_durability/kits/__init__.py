"""The store kits of the stores that ship in the core package (Memory, SQLite), registered by entry
point like every other store's (see ``without_durability.testing.kit``)."""
