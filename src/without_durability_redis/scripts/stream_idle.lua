-- IDLE (stream): where a reader should wait from, for a wait() that no empty take came before.
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- Returns {'', the newest entry's id or '0-0', the next timer in microseconds or ''}.
return nothing_ready()
