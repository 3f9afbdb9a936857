-- The fleet's key secret: what every app server of a fleet needs to name a
-- client's keys alike (lib/core/key-secret.ts, docs/reference/keys.md).
--
-- Servers without the `keySecret` option share a random secret kept in
-- KEYS[1]; servers with it write a digest of it to KEYS[2], so that a
-- server can tell, at start-up, that another one names keys otherwise.
-- Whichever server comes first writes its value (SET NX): later servers read
-- it. Neither key expires: a secret that expired would rename every key.
--
-- KEYS[1]  <prefix>:{keys}:secret  the random secret (base64url)
-- KEYS[2]  <prefix>:{keys}:check   the digest of a keySecret (base64url)
--   (one hash tag: one slot, so one script call on a Cluster)
-- ARGV[1]  1 to write KEYS[1], 2 to write KEYS[2], when it is missing
-- ARGV[2]  the value to write
--
-- Returns { secret, check }, each a string, or false (a nil reply) when
-- that key does not exist.

redis.call('SET', KEYS[tonumber(ARGV[1])], ARGV[2], 'NX')
return { redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2]) }
