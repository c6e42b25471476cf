package rediscounter

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts. Redis runs each atomically: no other command runs
// between its check and its write. Per SKU there are four keys:
//
//	{sku}:stock   the units left (a string holding an integer)
//	{sku}:keys    hash request key -> user: the keys that took a unit
//	{sku}:users   hash user -> request key: who holds a unit of the SKU
//	{sku}:nodes   hash request key -> the nodes that took or resent it
//	              (",0,1,"), so a node's restart can tell its own dead
//	              requests from another node's live ones (loadScript)
//
// The markers make a resend safe: a request whose unit was taken but
// whose row never reached PostgreSQL finds its key in {sku}:keys and goes
// on to the insert without taking a second unit; a give-back happens only
// for a key still marked, so it happens once.

// Answers of takeScript.
const (
	takeNotLoaded = -1 // the stock key is missing (Redis restarted empty)
	takeSoldOut   = 0
	takeTaken     = 1 // a unit was taken now
	takeResent    = 2 // this key took its unit before: go on to the insert
	takeUserHolds = 3 // the user holds a unit of the SKU
	takeKeyOther  = 4 // the key took a unit for another user, not yet in PostgreSQL
)

// takeScript: KEYS stock, keys, users, nodes; ARGV key, user, node. A
// resend adds its own node to the key's nodes: the unit is in flight there
// now, and may still be where the key was sent first.
var takeScript = redis.NewScript(strings.Replace(takeSource, "--resend\n", resendMarks, 1))

// resendMarks adds the node of a resend to its key's nodes. Replacing them
// (rediscounter until 2026-12-05) let a restart of the resend's node give
// back a unit whose first attempt was still in flight on another node;
// leaving them as they were let a restart of the first node give it back
// while the resend was in flight.
const resendMarks = `    local n = redis.call('HGET', KEYS[4], ARGV[1]) or ','
    if not string.find(n, ',' .. ARGV[3] .. ',', 1, true) then
      redis.call('HSET', KEYS[4], ARGV[1], n .. ARGV[3] .. ',')
    end
`

// takeKeepsNodeScript is takeScript with Mistake ResendKeepsNode: a resend
// leaves the key's nodes as they were. takeMovesNodeScript is takeScript
// with Mistake ResendMovesNode: a resend replaces them by its own.
var (
	takeKeepsNodeScript = redis.NewScript(strings.Replace(takeSource, "--resend\n", "", 1))
	takeMovesNodeScript = redis.NewScript(strings.Replace(takeSource, "--resend\n",
		"    redis.call('HSET', KEYS[4], ARGV[1], ',' .. ARGV[3] .. ',')\n", 1))
)

const takeSource = `
local owner = redis.call('HGET', KEYS[2], ARGV[1])
if owner then
  if owner == ARGV[2] then
--resend
    return 2
  end
  return 4
end
local s = redis.call('GET', KEYS[1])
if not s then return -1 end
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then return 3 end
if tonumber(s) <= 0 then return 0 end
redis.call('DECR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ',' .. ARGV[3] .. ',')
return 1
`

// giveBackScript returns the unit of a key that is still marked, once:
// KEYS stock, keys, users, nodes; ARGV key, user. It answers 1 if it gave
// a unit back. A stock key that is gone (Redis restarted) gets nothing:
// whatever reloads it counts from scratch.
var giveBackScript = redis.NewScript(`
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[3], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[3], ARGV[2]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCR', KEYS[1]) end
return 1
`)

// giveBackByUserScript is giveBackScript with Mistake GiveBackByUser: it
// asks whether the user still holds a unit, not whether this key does.
var giveBackByUserScript = redis.NewScript(`
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('HDEL', KEYS[3], ARGV[2]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCR', KEYS[1]) end
return 1
`)

// loadScript sets the stock and the markers of a SKU: KEYS stock, keys,
// users, nodes; ARGV force ("1" replaces what is there, "0" only loads a
// missing stock key), units (the total less the active reservations read),
// node, then key, user pairs of the active reservations. It answers 1 if it
// loaded.
//
// With a node (a restart of that node, which has waited for its own
// requests) a marked key that is not among the active reservations loses
// that node from its nodes; while another node is left, it stays marked
// and keeps its unit: that node's request may be between its script and
// its insert, and its row then commits after the read. A key whose only
// node was the restarted one died with its request, and its unit comes
// back. Without a node (Redis lost the counter, and every marker with it)
// the reservations are all there is.
var loadScript = redis.NewScript(`
if ARGV[1] == '0' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local active = {}
for i = 4, #ARGV, 2 do active[ARGV[i]] = true end
local kept = {}
if ARGV[3] ~= '' then
  local own = ',' .. ARGV[3] .. ','
  local taken = redis.call('HGETALL', KEYS[4])
  for i = 1, #taken, 2 do
    local k, n = taken[i], taken[i+1]
    if not active[k] then
      local from, to = string.find(n, own, 1, true)
      if from then n = string.sub(n, 1, from) .. string.sub(n, to + 1) end
      if n ~= ',' then
        local u = redis.call('HGET', KEYS[2], k)
        if u then kept[#kept+1] = {k, u, n} end
      end
    end
  end
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('SET', KEYS[1], tonumber(ARGV[2]) - #kept)
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i+1])
  redis.call('HSET', KEYS[3], ARGV[i+1], ARGV[i])
end
for _, e in ipairs(kept) do
  redis.call('HSET', KEYS[2], e[1], e[2])
  redis.call('HSET', KEYS[3], e[2], e[1])
  redis.call('HSET', KEYS[4], e[1], e[3])
end
return 1
`)

// giveBackBatchScript is Mistake BatchGiveBack's give-back of the rows one
// expiry run moved for one SKU: KEYS stock, keys, users, nodes; ARGV key,
// user pairs. It drops each key's markers and adds the number of rows,
// whatever the markers said.
var giveBackBatchScript = redis.NewScript(`
for i = 1, #ARGV, 2 do
  redis.call('HDEL', KEYS[4], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
  if redis.call('HGET', KEYS[3], ARGV[i+1]) == ARGV[i] then redis.call('HDEL', KEYS[3], ARGV[i+1]) end
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], #ARGV / 2) end
return #ARGV / 2
`)
