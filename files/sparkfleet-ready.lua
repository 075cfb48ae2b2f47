-- Managed by sparkfleet: the guard's answer to a front door's check of a chat engine (issue 54; docs/front-door.md,
-- "A sick engine"). templates/guard.haproxy.cfg.j2 serves it at the ready path of each chat listener, after the
-- backend key was checked, with what it needs in txn variables: the engine's loopback address (sf_ready_engine),
-- the key (key: the whole Authorization value), the chat probe's path and body (sf_ready_path, sf_ready_probe:
-- contract/serving.py's), the /metrics series (sf_ready_busy: the gauges of requests running and queued;
-- sf_ready_moves: the counters and gauges that move while it works: tokens, engine steps, the KV cache in use) and
-- the window (sf_ready_window_s: the longest a working engine leaves them all still, roles/guard.py).
--
-- The engine is ready (200) when
--   busy   it holds requests (running or queued) and one of the moving series changed within the window: a busy
--          engine is never judged by a probe that waits its turn behind colleagues' long prompts;
--   idle   it holds none and answers the one-token chat probe within PROBE_S.
-- Else 503, with why: no answer to /metrics within METRICS_S (frozen, hung, dead), a busy engine whose series
-- stood still for the window (wedged: its API answers, its generation does not), or an idle one whose probe failed.
-- An engine without /metrics (another status) is judged by the probe alone. One Lua state for every thread: the
-- last values and when they last moved, per engine, live here from the guard's start (a start or a reload gives a
-- busy engine a fresh window).

local METRICS_S = 2  -- each step of asking /metrics (connect, send, each read)
local PROBE_S = 1  -- the idle probe's bound: an idle engine answers one token in well under it
local MAX_BYTES = 4 * 1024 * 1024  -- the most of a /metrics answer read

local seen = {}  -- engine address -> {values = "...", moved = seconds}

local function now_s()
  local t = core.now()
  return t.sec + t.usec / 1000000
end

-- One HTTP/1.0 exchange with the engine on loopback: status and body, or nil and why.
local function ask(engine, timeout_s, method, path, key, body)
  local host, port = engine:match("^%[(.+)%]:(%d+)$")
  if not host then
    host, port = engine:match("^(.+):(%d+)$")
  end
  local sock = core.tcp()
  sock:settimeout(timeout_s)
  local ok, err = sock:connect(host, tonumber(port))
  if not ok then
    sock:close()
    return nil, "no connection (" .. tostring(err) .. ")"
  end
  local head = method .. " " .. path .. " HTTP/1.0\r\nHost: engine\r\nConnection: close\r\n"
  if key and key ~= "" then
    head = head .. "Authorization: " .. key .. "\r\n"
  end
  if body then
    head = head .. "Content-Type: application/json\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body
  else
    head = head .. "\r\n"
  end
  sock:send(head)
  local line = sock:receive("*l")
  if not line then
    sock:close()
    return nil, "no answer within " .. timeout_s .. " s"
  end
  local status = tonumber(line:match("^HTTP/%d%.%d (%d%d%d)"))
  local length = nil
  while true do
    local h = sock:receive("*l")
    if h == nil then
      sock:close()
      return nil, "its answer's headers cut"
    end
    if h == "" or h == "\r" then
      break
    end
    local n = h:lower():match("^content%-length:%s*(%d+)")
    if n then
      length = tonumber(n)
    end
  end
  local data
  if length then
    data = length > 0 and sock:receive(math.min(length, MAX_BYTES)) or ""
  else
    data = sock:receive("*a")
  end
  sock:close()
  if data == nil then
    return nil, "its answer's body cut"
  end
  return status, data
end

-- The sum of each named series over its label sets ("a b c": names separated by spaces).
local function sums(body, wanted)
  local names = {}
  for name in wanted:gmatch("%S+") do
    names[name] = 0
  end
  for line in body:gmatch("[^\n]+") do
    if line:sub(1, 1) ~= "#" then
      local name, rest = line:match("^([%w_:]+)(.*)$")
      if name and names[name] then
        local value = rest:match("^{.*}%s+(%S+)") or rest:match("^%s+(%S+)")
        names[name] = names[name] + (tonumber(value) or 0)
      end
    end
  end
  return names
end

local function answer(applet, status, why)
  why = why:gsub('[%c"\\]', " ")
  local body = '{"ready":' .. (status == 200 and "true" or "false") .. ',"why":"' .. why .. '"}'
  -- the reason phrase too: the door's log and `show stat` (check_desc) say why a check failed
  applet:set_status(status, why:sub(1, 120))
  applet:add_header("content-type", "application/json")
  applet:add_header("content-length", tostring(#body))
  applet:add_header("cache-control", "no-store")
  applet:start_response()
  applet:send(body)
end

local function probe(applet, engine, key, why)
  local status, err = ask(engine, PROBE_S, "POST", applet:get_var("txn.sf_ready_path"), key,
                          applet:get_var("txn.sf_ready_probe"))
  if status == 200 then
    return answer(applet, 200, why .. ": the chat probe answered")
  end
  return answer(applet, 503, why .. ": the chat probe " .. (status and ("answered " .. status) or err))
end

core.register_service("sparkfleet_ready", "http", function(applet)
  local engine = applet:get_var("txn.sf_ready_engine")
  local key = applet:get_var("txn.key")
  local status, body = ask(engine, METRICS_S, "GET", "/metrics", key, nil)
  if status == nil then
    return answer(applet, 503, "/metrics: " .. body)
  end
  if status ~= 200 then
    return probe(applet, engine, key, "no /metrics (" .. status .. ")")
  end
  local busy = 0
  for _, v in pairs(sums(body, applet:get_var("txn.sf_ready_busy"))) do
    busy = busy + v
  end
  local values = {}
  local moving = sums(body, applet:get_var("txn.sf_ready_moves"))
  for name, v in pairs(moving) do
    values[#values + 1] = name .. "=" .. string.format("%.17g", v)
  end
  table.sort(values)
  local now, fingerprint = now_s(), table.concat(values, " ")
  local last = seen[engine]
  if last == nil or last.values ~= fingerprint then
    last = {values = fingerprint, moved = now}
    seen[engine] = last
  end
  if busy <= 0 then
    return probe(applet, engine, key, "idle")
  end
  local still = now - last.moved
  local window = tonumber(applet:get_var("txn.sf_ready_window_s")) or 0
  if still <= window then
    return answer(applet, 200, string.format("busy: %d in flight, working (its series moved %.1f s ago)", busy, still))
  end
  return answer(applet, 503, string.format("stalled: %d in flight, nothing moved for %.1f s (window %d s)", busy,
                                           still, window))
end)
