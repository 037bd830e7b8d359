-- wrk -t2 -c64 -d10s -s bench/http/replay.lua http://127.0.0.1:PORT -- x 100 10000
-- POST /v1/withdrawals with the seeded keys rp-0 .. rp-9999 and their exact bodies
-- (1 RUB from acct-(i % 100)): every answer should be a 201 replay.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "common.lua")

function request()
   n = n + 1
   local i = (id * 4999 + n) % replay_keys
   return withdrawal(string.format("rp-%d", i), i % accounts)
end
