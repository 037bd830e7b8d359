-- Shared by new_key.lua and replay.lua (loaded with dofile by path from the script's
-- own folder). Counts answers per thread and prints key=value lines in done(), which
-- bench/http/run.sh turns into a table row.
--
-- Arguments after `--`: tag accounts replay_keys

local threads = {}

function setup(thread)
   thread:set("id", #threads)
   table.insert(threads, thread)
end

function init(args)
   tag = args[1] or "wrk"
   accounts = tonumber(args[2] or "100")
   replay_keys = tonumber(args[3] or "10000")
   n = 0
   first = 0
   replayed = 0
   non201 = 0
end

function withdrawal(key, account)
   local body = string.format('{"account":"acct-%d","amount":1,"currency":"RUB"}', account)
   return wrk.format("POST", "/v1/withdrawals",
      { ["Idempotency-Key"] = key, ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, body)
   if status ~= 201 then
      non201 = non201 + 1
   elseif headers["idempotent-replayed"] or headers["Idempotent-Replayed"] then
      replayed = replayed + 1
   else
      first = first + 1
   end
end

function done(summary, latency, requests)
   local f, r, x = 0, 0, 0
   for _, t in ipairs(threads) do
      f = f + t:get("first")
      r = r + t:get("replayed")
      x = x + t:get("non201")
   end
   local seconds = summary.duration / 1e6
   local e = summary.errors
   io.write(string.format("seconds=%.2f\n", seconds))
   io.write(string.format("requests=%d\n", summary.requests))
   io.write(string.format("rps=%.0f\n", summary.requests / seconds))
   io.write(string.format("p50_us=%d\n", latency:percentile(50)))
   io.write(string.format("p90_us=%d\n", latency:percentile(90)))
   io.write(string.format("p99_us=%d\n", latency:percentile(99)))
   io.write(string.format("p999_us=%d\n", latency:percentile(99.9)))
   io.write(string.format("max_us=%d\n", latency.max))
   io.write(string.format("first=%d\n", f))
   io.write(string.format("replayed=%d\n", r))
   io.write(string.format("non201=%d\n", x))
   io.write(string.format("errors=%d\n", e.connect + e.read + e.write + e.timeout))
end
