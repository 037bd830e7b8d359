-- wrk -t2 -c64 -d10s -s bench/http/new_key.lua http://127.0.0.1:PORT -- TAG 100
-- POST /v1/withdrawals, a fresh Idempotency-Key every request (TAG-thread-counter),
-- 1 RUB from one of the accounts acct-0 .. acct-99. Every answer should be a first
-- execution (201 without Idempotent-Replayed).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "common.lua")

function request()
   n = n + 1
   return withdrawal(string.format("%s-%d-%d", tag, id, n), (id * 7 + n) % accounts)
end
