-- Managed by sparkfleet: per-user usage at the front door (templates/front-door.haproxy.cfg.j2 calls it).
--
-- Keyed by the user's NAME (txn.user, from the users map), never a key. Loaded with `lua-load` (one Lua state
-- that every thread shares), so the counts are the front door's, from its snapshot on (below).
-- What HAProxy counts itself, per user, is read from the stick table `sparkfleet_usage` (bytes both ways,
-- requests in flight, requests refused with 429); what it cannot, per user and model, is counted here:
--   requests   each request let through to an engine (by the `model` of its body)
--   errors     each engine answer of status 400 and up
--   tokens     usage.prompt_tokens / usage.completion_tokens of a non-streamed application/json answer that
--              fits in one buffer (the config reads them with json_query into txn.sf_prompt / txn.sf_completion)
-- Label values are data: the config hands only user names and served model names (or "_other", "_none"),
-- and they are escaped here anyway; the number of (user, model) series is capped.
--
-- Counts survive a restart, a reload and a takeover by another door's return: where the config sets
-- SPARKFLEET_USAGE_SNAPSHOT (a root-only file under /var/lib), lua-load (as root, before the chroot) starts from
-- it, and what /usage/metrics reports is the counts as of the last snapshot written (two steps on the admin
-- socket, by files/sparkfleet-usage-save: `sparkfleet usage dump` hands the counts and a generation, and
-- `sparkfleet usage saved GEN` once that file is on disk). So a reported count is always one the door reloads:
-- what it reports never decreases; what a door's loss can still lose is what it counted since its last
-- snapshot (never reported).

local TABLE = "sparkfleet_usage"
local MAX_SERIES = 10000
local MAX_TOKENS = 100000000  -- one answer's reported tokens above this are not counted (not a real answer)

local SNAPSHOT = os.getenv("SPARKFLEET_USAGE_SNAPSHOT")  -- nil: no snapshot, counts since the last start
local FORMAT = "sparkfleet-usage 1"
local FIELDS = {"requests", "errors", "prompt", "completion"}
local MAX_COUNT = 9007199254740992  -- 2^53: a count above it in a snapshot is not believed

local counts = {}  -- "user\0model" -> {user=, model=, requests=, errors=, prompt=, completion=}
local series = 0
local served = nil  -- what /usage/metrics reports where a snapshot is kept: the counts of the last one written
local pending = nil  -- {gen=, copy=}: the counts handed to the last `dump`, reported once `saved GEN` says so
local generation = 0

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

local function copy_counts()
  local out = {}
  for id, e in pairs(counts) do
    out[id] = {user = e.user, model = e.model, requests = e.requests, errors = e.errors, prompt = e.prompt,
               completion = e.completion}
  end
  return out
end

-- One snapshot line: user TAB model TAB requests TAB errors TAB prompt TAB completion (names of the users map's
-- and served names' grammars, so no tab, space or line end in them); anything else is skipped.
local function load_snapshot(path)
  local file = path and io.open(path, "r")
  if not file then
    return
  end
  local first = file:read("*l")
  if first == nil or first:sub(1, #FORMAT) ~= FORMAT then
    file:close()
    core.Warning("sparkfleet usage: " .. path .. " is not a usage snapshot: counting from zero")
    return
  end
  for line in file:lines() do
    local user, model, r, e, p, c = line:match(
      "^([A-Za-z0-9][A-Za-z0-9_.-]*)\t([A-Za-z0-9_][A-Za-z0-9_.:/+-]*)\t(%d+)\t(%d+)\t(%d+)\t(%d+)$")
    if user and #user <= 255 and #model <= 255 then
      local values = {tonumber(r), tonumber(e), tonumber(p), tonumber(c)}
      local fine = true
      for _, v in ipairs(values) do
        if v == nil or v > MAX_COUNT then
          fine = false
        end
      end
      local entry_ = fine and entry(user, model)
      if entry_ then
        for i, field in ipairs(FIELDS) do
          entry_[field] = math.max(entry_[field], values[i])
        end
      end
    end
  end
  file:close()
end

if SNAPSHOT then
  load_snapshot(SNAPSHOT)
  served = copy_counts()
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
  local reported = served or counts
  for _, id in ipairs(sorted_keys(reported)) do
    local e = reported[id]
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

-- The snapshot's two steps on the admin socket (root-only): `sparkfleet usage dump` prints the counts now, as
-- a snapshot with its generation; `sparkfleet usage saved GEN`, once that file is on disk, makes them what
-- /usage/metrics reports.
core.register_cli({"sparkfleet", "usage"}, "sparkfleet usage dump | saved GEN : the usage snapshot's two steps",
  function(applet, _, _, verb, gen)
    if verb == "dump" then
      generation = generation + 1
      pending = {gen = generation, copy = copy_counts()}
      local out = {FORMAT .. " " .. string.format("%d", generation)}
      for _, id in ipairs(sorted_keys(pending.copy)) do
        local e = pending.copy[id]
        out[#out + 1] = table.concat({e.user, e.model, string.format("%d", e.requests), string.format("%d", e.errors),
                                      string.format("%d", e.prompt), string.format("%d", e.completion)}, "\t")
      end
      applet:send(table.concat(out, "\n") .. "\n")
    elseif verb == "saved" and pending and tonumber(gen) == pending.gen then
      served = pending.copy
      pending = nil
      applet:send("saved " .. string.format("%d", generation) .. "\n")
    else
      applet:send("not saved: no such dump\n")
    end
  end)
