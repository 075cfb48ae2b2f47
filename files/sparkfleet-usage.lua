-- Managed by sparkfleet: per-user usage at the front door (templates/front-door.haproxy.cfg.j2 calls it).
--
-- Keyed by the user's NAME (txn.user, from the users map), never a key. Loaded with `lua-load` (one Lua state
-- that every thread shares), so the counts are the front door's since its last start or reload.
-- What HAProxy counts itself, per user, is read from the stick table `sparkfleet_usage` (bytes both ways,
-- requests in flight, requests refused with 429); what it cannot, per user and model, is counted here:
--   requests   each request let through to an engine (by the `model` of its body)
--   errors     each engine answer of status 400 and up
--   tokens     usage.prompt_tokens / usage.completion_tokens of a non-streamed application/json answer that
--              fits in one buffer (the config reads them with json_query into txn.sf_prompt / txn.sf_completion)
-- Label values are data: the config hands only user names and served model names (or "_other", "_none"),
-- and they are escaped here anyway; the number of (user, model) series is capped.

local TABLE = "sparkfleet_usage"
local MAX_SERIES = 10000
local MAX_TOKENS = 100000000  -- one answer's reported tokens above this are not counted (not a real answer)

local counts = {}  -- "user\0model" -> {user=, model=, requests=, errors=, prompt=, completion=}
local series = 0

local function entry(user, model)
  local id = user .. "\0" .. model
  local e = counts[id]
  if e == nil then
    if series >= MAX_SERIES then
      return nil
    end
    e = {user = user, model = model, requests = 0, errors = 0, prompt = 0, completion = 0}
    counts[id] = e
    series = series + 1
  end
  return e
end

local function named(txn)
  local user = txn:get_var("txn.user")
  if type(user) ~= "string" or user == "" then
    return nil
  end
  local model = txn:get_var("txn.sf_model")
  if type(model) ~= "string" or model == "" then
    model = "_none"
  end
  return entry(user, model)
end

local function tokens(value)
  local n = tonumber(value)
  if n == nil or n < 0 or n > MAX_TOKENS or n ~= math.floor(n) then
    return 0
  end
  return math.floor(n)
end

core.register_action("sparkfleet_usage_request", {"http-req"}, function(txn)
  local e = named(txn)
  if e then
    e.requests = e.requests + 1
  end
end)

core.register_action("sparkfleet_usage_response", {"http-res"}, function(txn)
  local e = named(txn)
  if e == nil then
    return
  end
  local status = tonumber(txn.sf:status()) or 0
  if status >= 400 then
    e.errors = e.errors + 1
  end
  e.prompt = e.prompt + tokens(txn:get_var("txn.sf_prompt"))
  e.completion = e.completion + tokens(txn:get_var("txn.sf_completion"))
end)

local function label(value)
  return (tostring(value):gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub('"', '\\"'))
end

local function metric(out, name, help, kind, rows)
  out[#out + 1] = "# HELP " .. name .. " " .. help
  out[#out + 1] = "# TYPE " .. name .. " " .. kind
  for _, row in ipairs(rows) do
    out[#out + 1] = row
  end
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do
    keys[#keys + 1] = k
  end
  table.sort(keys)
  return keys
end

local function exposition()
  local per_model = {requests = {}, errors = {}, prompt = {}, completion = {}}
  for _, id in ipairs(sorted_keys(counts)) do
    local e = counts[id]
    local labels = '{user="' .. label(e.user) .. '",model="' .. label(e.model) .. '"} '
    for field, rows in pairs(per_model) do
      rows[#rows + 1] = labels .. string.format("%d", e[field])
    end
  end
  local per_user = {bytes_in_cnt = {}, bytes_out_cnt = {}, conn_cur = {}, gpc0 = {}}
  local backend = core.backends[TABLE]
  local dumped = backend and backend.stktable and backend.stktable:dump() or {}
  for _, user in ipairs(sorted_keys(dumped)) do
    local data = dumped[user]
    for field, rows in pairs(per_user) do
      rows[#rows + 1] = '{user="' .. label(user) .. '"} ' .. string.format("%d", tonumber(data[field]) or 0)
    end
  end
  local out = {}
  local function prefixed(name, rows)
    local lines = {}
    for i, row in ipairs(rows) do
      lines[i] = name .. row
    end
    return lines
  end
  local function add(name, help, kind, rows)
    metric(out, name, help, kind, prefixed(name, rows))
  end
  add("sparkfleet_user_requests_total", "requests let through to an engine, per user and model", "counter",
      per_model.requests)
  add("sparkfleet_user_errors_total", "engine answers of status 400 and up, per user and model", "counter",
      per_model.errors)
  add("sparkfleet_user_prompt_tokens_total", "prompt tokens the engines reported (usage) per user and model",
      "counter", per_model.prompt)
  add("sparkfleet_user_completion_tokens_total", "completion tokens the engines reported per user and model",
      "counter", per_model.completion)
  add("sparkfleet_user_bytes_in_total", "request bytes (headers and body) per user", "counter",
      per_user.bytes_in_cnt)
  add("sparkfleet_user_bytes_out_total", "response bytes (headers and body) per user", "counter",
      per_user.bytes_out_cnt)
  add("sparkfleet_user_in_flight", "requests in flight per user", "gauge", per_user.conn_cur)
  add("sparkfleet_user_limited_total", "requests refused with 429 per user", "counter", per_user.gpc0)
  return table.concat(out, "\n") .. "\n"
end

core.register_service("sparkfleet_usage_metrics", "http", function(applet)
  local body = exposition()
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
  applet:add_header("content-length", tostring(string.len(body)))
  applet:add_header("cache-control", "no-store")
  applet:start_response()
  applet:send(body)
end)
