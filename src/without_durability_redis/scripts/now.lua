-- NOW: the clock of the node that owns KEYS[1], so visibility is read where it is compared.
-- KEYS[1] any key of the structure whose clock is wanted (it is not touched)
-- Returns the server's time in microseconds, as text.
return int(now_us())
