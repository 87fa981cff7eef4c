-- The PostgreSQL engine's tables and functions (see ratelimits/engine/postgres.py), made
-- by the engine on first use in the first schema of its search_path. Every name carries
-- the version of this file: a release that changes them creates new ones beside the
-- old, so processes of two releases never run each other's code.
--
-- The state is UNLOGGED: no WAL is written for it, so a decision costs no disk flush
-- and no replication traffic. After a crash PostgreSQL empties it, which forgets
-- every client's count, as a Redis without persistence forgets it after a restart;
-- a limiter's counts are short-lived and a standby has no use for them. The policy
-- version is logged: it must never go back.

CREATE UNLOGGED TABLE IF NOT EXISTS ratelimits_state_v1 (
    -- the engine's key of one client's state (`keynames.client_key`, a window's
    -- `:<window>`, a warm-up's `:w`); "C": compared as bytes, so that a client's keys
    -- sort together and a range scan finds them
    k text COLLATE "C" PRIMARY KEY,
    -- the numbers of its state: a count, (tokens, time), a time, a log of times, or the
    -- expiries of the slots held (with their names in `m`)
    v float8[] NOT NULL,
    m text[],
    -- µs since the epoch: a row past it is absent, and is deleted by a later sweep
    expires float8 NOT NULL
);
CREATE INDEX IF NOT EXISTS ratelimits_state_v1_expires ON ratelimits_state_v1 (expires);

CREATE UNLOGGED TABLE IF NOT EXISTS ratelimits_counts_v1 (
    name text NOT NULL,
    minute bigint NOT NULL,
    field text NOT NULL,
    n bigint NOT NULL,
    expires float8 NOT NULL,
    PRIMARY KEY (name, minute, field)
);
CREATE INDEX IF NOT EXISTS ratelimits_counts_v1_expires ON ratelimits_counts_v1 (expires);

CREATE UNLOGGED TABLE IF NOT EXISTS ratelimits_offenders_v1 (
    name text NOT NULL,
    hour bigint NOT NULL,
    who text COLLATE "C" NOT NULL,
    n bigint NOT NULL,
    -- the count inherited on entering a full list (Space-Saving): n - e is certain
    e bigint NOT NULL,
    expires float8 NOT NULL,
    PRIMARY KEY (name, hour, who)
);
CREATE INDEX IF NOT EXISTS ratelimits_offenders_v1_expires ON ratelimits_offenders_v1 (expires);

-- The heartbeat (engine/heartbeat.py's twin): each process's row under its group (the
-- key prefix), with the server time of its last beat.
CREATE UNLOGGED TABLE IF NOT EXISTS ratelimits_live_v1 (
    grp text NOT NULL,
    member text NOT NULL,
    seen float8 NOT NULL,
    PRIMARY KEY (grp, member)
);

CREATE TABLE IF NOT EXISTS ratelimits_version_v1 (
    k text PRIMARY KEY,
    v bigint NOT NULL
);

-- The expiry a write of `ttl` µs at `now` gets: whole milliseconds, rounded up, at least
-- one (what Redis's PEXPIRE and the in-process store give).
CREATE OR REPLACE FUNCTION ratelimits_expiry_v1(now float8, ttl float8) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$ SELECT now + greatest(1, ceil(ttl / 1000)) * 1000 $$;

-- floor(x + FLOOR_EPS), at least 0 (algorithms.py `_floor0`).
CREATE OR REPLACE FUNCTION ratelimits_floor0_v1(x float8) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$ SELECT greatest(0, floor(x + __FLOOR_EPS__)) $$;

-- How long until a sliding window refusing `c` units at `elapsed` µs into its window
-- admits them: once the previous window's weight falls enough, or, when the current
-- window alone is too full, into the next window (lua/prelude.lua's `sliding_retry`).
CREATE OR REPLACE FUNCTION ratelimits_sliding_retry_v1(
    "L" float8, "P" float8, c float8, prev float8, cur float8, elapsed float8)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(1, CASE WHEN cur + c <= "L"
                            THEN ceil("P" - ("L" - cur - c) * "P" / prev - elapsed)
                            ELSE ceil("P" - elapsed + "P" - ("L" - c) * "P" / cur) END)
$$;

-- Take back what a reservation made at `now` charged (charging.unreserve, the twin of
-- lua/check_all.lua's): from the window it counted in, from the log, from a bucket not
-- refilled since, from a GCRA arrival time; each row keeps its expiry.
CREATE OR REPLACE FUNCTION ratelimits_unreserve_v1(
    p_key text, p_alg text, now float8, "L" float8, "P" float8, "B" float8, c float8,
    p_cal_win float8) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    st float8[];
    tat float8;
BEGIN
    IF p_alg IN ('fixed_window', 'sliding_window') THEN
        UPDATE ratelimits_state_v1 SET v[1] = v[1] - c
            WHERE k = p_key || ':' || coalesce(p_cal_win, floor(now / "P"))::bigint
              AND expires > now AND v[1] >= c;
    ELSIF p_alg = 'sliding_log' THEN
        SELECT s.v INTO st FROM ratelimits_state_v1 s WHERE s.k = p_key AND s.expires > now;
        IF st IS NOT NULL THEN
            -- the first `c` entries at `now` go, the others stay in order
            SELECT coalesce(array_agg(t ORDER BY o), '{}') INTO st FROM (
                SELECT t, o, row_number() OVER (PARTITION BY t = now ORDER BY o) AS r
                FROM unnest(st) WITH ORDINALITY u(t, o)) x
                WHERE NOT (t = now AND r <= c);
            UPDATE ratelimits_state_v1 SET v = st WHERE k = p_key;
        END IF;
    ELSIF p_alg = 'token_bucket' THEN
        UPDATE ratelimits_state_v1 SET v[1] = least("B", v[1] + c)
            WHERE k = p_key AND expires > now AND v[2] = now;
    ELSIF p_alg = 'gcra' THEN
        SELECT s.v[1] INTO tat FROM ratelimits_state_v1 s WHERE s.k = p_key AND s.expires > now;
        IF tat IS NOT NULL THEN
            tat := tat - c * "P" / "L";
            IF tat <= now THEN
                DELETE FROM ratelimits_state_v1 WHERE k = p_key;
            ELSE
                UPDATE ratelimits_state_v1 SET v[1] = tat WHERE k = p_key;
            END IF;
        END IF;
    END IF;
END
$$;

-- Lock the clients of `p_keys` until the transaction ends: transaction-level advisory
-- locks, taken in the order of their hashes, so that two calls sharing keys wait for
-- each other and never deadlock; each wait at most `p_ms` milliseconds (0: no bound),
-- a bound for the rest of the call's transaction only, so that a server connection goes
-- back to a pool (PgBouncer's) with nothing changed for the next client. A transaction
-- that is not read committed is refused: each statement of a decision must read what
-- the previous holder of a client's lock committed.
CREATE OR REPLACE FUNCTION ratelimits_lock_v1(p_keys text[], p_ms int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    h int;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_transaction_state', MESSAGE =
            'the limiter''s calls need read committed transactions, and this session''s '
            || 'default is ' || current_setting('transaction_isolation') || ': give the '
            || 'limiter''s role default_transaction_isolation = ''read committed'', or its '
            || 'URL options=-cdefault_transaction_isolation=read%20committed';
    END IF;
    IF p_ms > 0 THEN
        PERFORM set_config('lock_timeout', p_ms || 'ms', true);
    END IF;
    FOR h IN SELECT DISTINCT hashtext(x) FROM unnest(p_keys) x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(__LOCK_SPACE__, h);
    END LOOP;
END
$$;

-- One request's limits decided in one call: every limit checked, then all of them
-- charged or none (a refusal by a limit that is not a shadow charges nothing), each
-- step as its twin in ratelimits/engine/algorithms.py, in the same float8 (IEEE double)
-- arithmetic, so both reach the same figures. Times are µs; `p_now` NULL: the server's
-- clock. A calendar window is given by its number and end (`p_cal_win`, `p_cal_end`;
-- NULL: a period-long window), a lockout in µs (0: none), a stage as `Limit.stage`
-- (2: take back the reservation made at `p_now`). The clients' states are locked by transaction-level advisory locks taken in
-- the order of their hashes, so two requests sharing keys wait for each other and never
-- deadlock; the locks end with the call's transaction (the engine's connection is in
-- autocommit, so that is this statement).
CREATE OR REPLACE FUNCTION ratelimits_decide_v1(
    p_now float8, p_keys text[], p_algos text[], p_l float8[], p_p float8[], p_b float8[],
    p_c float8[], p_mw float8[], p_w float8[], p_shadow boolean[], p_lockout float8[],
    p_stage int[], p_cal_win float8[], p_cal_end float8[], p_token text,
    p_version_key text, p_lock_ms int,
    OUT now_us float8, OUT admitted boolean, OUT version bigint, OUT remaining float8[],
    OUT reset_after float8[], OUT wait float8[], OUT outcome text[])
LANGUAGE plpgsql AS $$
DECLARE
    nl int := coalesce(array_length(p_keys, 1), 0);
    now float8;
    i int;
    j int;
    key text;
    wkey text;
    al text;
    locked boolean[] := '{}';
    is_locked boolean;
    until float8;
    "L" float8; "P" float8; "B" float8; c float8; mw float8; "W" float8;
    "T" float8; "C" float8;
    st float8[];
    held text[];
    ok int[] := '{}';
    rem float8[] := '{}';
    rst float8[] := '{}';
    rty float8[] := '{}';
    dly float8[] := '{}';
    -- the writes an admitted request makes: the limit's index, key, value, members, ttl
    w_i int[] := '{}';
    w_k text[] := '{}';
    w_v text[] := '{}';
    w_m text[] := '{}';
    w_ttl float8[] := '{}';
    a int; r_rem float8; r_rst float8; r_rty float8; r_dly float8;
    win float8; elapsed float8; cur float8; prev float8; est float8; cnt float8;
    tokens float8; ts float8; after float8; tat float8; nw float8; allow_at float8;
    gap float8; wn float8; ww float8; n2 float8; w2 float8; horizon float8;
    refused boolean := false;
BEGIN
    now := coalesce(p_now, floor(extract(epoch FROM clock_timestamp())::float8 * 1000000));
    now_us := now;
    PERFORM ratelimits_lock_v1(p_keys, p_lock_ms);

    FOR i IN 1 .. nl LOOP
        key := p_keys[i]; al := p_algos[i];
        "L" := p_l[i]; "P" := p_p[i]; "B" := p_b[i]; c := p_c[i]; mw := p_mw[i];
        "W" := p_w[i];
        r_dly := 0; r_rty := 0; is_locked := false;
        IF p_stage[i] = 2 THEN
            -- a reservation taken back: not checked, never refuses (charging.unreserve)
            PERFORM ratelimits_unreserve_v1(key, al, now, "L", "P", "B", c, p_cal_win[i]);
            a := 1; r_rem := 0; r_rst := 0;
        ELSIF al = 'fixed_window' THEN
            IF p_cal_win[i] IS NULL THEN
                win := floor(now / "P");
                r_rst := (win + 1) * "P" - now;
            ELSE
                win := p_cal_win[i];
                r_rst := p_cal_end[i] - now;
            END IF;
            wkey := key || ':' || win::bigint;
            SELECT s.v[1] INTO cnt FROM ratelimits_state_v1 s WHERE s.k = wkey AND s.expires > now;
            cnt := coalesce(cnt, 0);
            IF cnt + c <= "L" THEN
                a := 1; r_rem := "L" - cnt - c;
                w_i := w_i || i; w_k := w_k || wkey; w_v := w_v || ARRAY[cnt + c]::text;
                w_m := w_m || NULL::text; w_ttl := w_ttl || r_rst;
            ELSE
                a := 0; r_rem := ratelimits_floor0_v1("L" - cnt); r_rty := r_rst;
            END IF;
        ELSIF al = 'sliding_window' THEN
            win := floor(now / "P");
            elapsed := now - win * "P";
            SELECT s.v[1] INTO cur FROM ratelimits_state_v1 s
                WHERE s.k = key || ':' || win::bigint AND s.expires > now;
            SELECT s.v[1] INTO prev FROM ratelimits_state_v1 s
                WHERE s.k = key || ':' || (win - 1)::bigint AND s.expires > now;
            cur := coalesce(cur, 0); prev := coalesce(prev, 0);
            est := prev * ("P" - elapsed) / "P" + cur;
            IF est + c <= "L" + __TOKEN_EPS__ THEN
                a := 1; r_rem := ratelimits_floor0_v1("L" - est - c);
                r_rst := 2 * "P" - elapsed;
                w_i := w_i || i; w_k := w_k || (key || ':' || win::bigint);
                w_v := w_v || ARRAY[cur + c]::text; w_m := w_m || NULL::text;
                w_ttl := w_ttl || (2 * "P" - elapsed);
            ELSE
                a := 0;
                r_rty := ratelimits_sliding_retry_v1("L", "P", c, prev, cur, elapsed);
                r_rst := CASE WHEN cur > 0 THEN 2 * "P" - elapsed ELSE "P" - elapsed END;
                r_rem := ratelimits_floor0_v1("L" - est);
            END IF;
        ELSIF al = 'sliding_log' THEN
            SELECT coalesce(array_agg(t ORDER BY t), '{}') INTO st
                FROM ratelimits_state_v1 s, unnest(s.v) t
                WHERE s.k = key AND s.expires > now AND t > now - "P";
            cnt := coalesce(array_length(st, 1), 0);
            r_rst := "P";
            IF cnt + c <= "L" THEN
                a := 1; r_rem := "L" - cnt - c;
                SELECT array_agg(t ORDER BY t) INTO st
                    FROM (SELECT unnest(st) t UNION ALL SELECT now FROM generate_series(1, c::int)) u;
                w_i := w_i || i; w_k := w_k || key; w_v := w_v || st::text;
                w_m := w_m || NULL::text; w_ttl := w_ttl || "P";
            ELSE
                a := 0; r_rem := ratelimits_floor0_v1("L" - cnt);
                r_rst := st[cnt] + "P" - now;
                r_rty := st[(cnt + c - "L")::int] + "P" - now;
            END IF;
        ELSIF al = 'token_bucket' THEN
            SELECT s.v INTO st FROM ratelimits_state_v1 s WHERE s.k = key AND s.expires > now;
            tokens := "B"; ts := now;
            IF st IS NOT NULL THEN
                tokens := st[1]; ts := st[2];
                IF now > ts THEN
                    tokens := least("B", tokens + (now - ts) * "L" / "P");
                    ts := now;
                END IF;
            END IF;
            IF tokens + __TOKEN_EPS__ + mw * "L" / "P" >= c THEN
                a := 1; after := tokens - c;
                r_dly := CASE WHEN tokens + __TOKEN_EPS__ >= c THEN 0
                              ELSE ceil((c - tokens) * "P" / "L") END;
                r_rem := ratelimits_floor0_v1(after);
                r_rst := ceil(("B" - after) * "P" / "L");
                w_i := w_i || i; w_k := w_k || key; w_v := w_v || ARRAY[after, ts]::text;
                w_m := w_m || NULL::text; w_ttl := w_ttl || r_rst;
            ELSE
                a := 0; r_rem := ratelimits_floor0_v1(tokens);
                r_rst := ceil(("B" - tokens) * "P" / "L");
                r_rty := ceil((c - tokens) * "P" / "L" - mw);
            END IF;
        ELSIF al = 'leaky_bucket' OR al = 'gcra' THEN
            "T" := "P" / "L";
            SELECT s.v[1] INTO tat FROM ratelimits_state_v1 s WHERE s.k = key AND s.expires > now;
            IF tat IS NULL OR tat < now THEN tat := now; END IF;
            IF al = 'leaky_bucket' THEN
                IF tat - now <= "B" * "T" + mw + __EPS__ THEN
                    after := tat + c * "T";
                    a := 1; r_rem := ratelimits_floor0_v1(("B" * "T" - (after - now)) / "T" + 1);
                    r_rst := ceil(after - now); r_dly := ceil(tat - now);
                ELSE
                    a := 0; r_rem := 0; r_rst := ceil(tat - now);
                    r_rty := ceil(tat - now - "B" * "T" - mw);
                END IF;
            ELSE
                after := tat + c * "T";
                allow_at := after - "B" * "T";
                IF now + __EPS__ + mw >= allow_at THEN
                    a := 1;
                    r_dly := CASE WHEN now + __EPS__ >= allow_at THEN 0
                                  ELSE ceil(allow_at - now) END;
                    r_rem := ratelimits_floor0_v1((now - allow_at) / "T");
                    r_rst := ceil(after - now);
                ELSE
                    a := 0; r_rem := ratelimits_floor0_v1(("B" * "T" - (tat - now)) / "T");
                    r_rst := ceil(tat - now); r_rty := ceil(allow_at - now - mw);
                END IF;
            END IF;
            IF a = 1 THEN
                w_i := w_i || i; w_k := w_k || key; w_v := w_v || ARRAY[after]::text;
                w_m := w_m || NULL::text; w_ttl := w_ttl || r_rst;
            END IF;
        ELSIF al = 'concurrency' THEN
            SELECT coalesce(array_agg(e ORDER BY o), '{}'), coalesce(array_agg(mm ORDER BY o), '{}')
                INTO st, held
                FROM ratelimits_state_v1 s, unnest(s.v, s.m) WITH ORDINALITY u(e, mm, o)
                WHERE s.k = key AND s.expires > now AND e > now;
            cnt := coalesce(array_length(st, 1), 0);
            r_rst := "P";
            IF cnt + c <= "L" THEN
                a := 1; r_rem := "L" - cnt - c;
                FOR j IN 1 .. c::int LOOP
                    st := st || (now + "P"); held := held || (p_token || ':' || j);
                END LOOP;
                w_i := w_i || i; w_k := w_k || key; w_v := w_v || st::text;
                w_m := w_m || held::text; w_ttl := w_ttl || "P";
            ELSE
                a := 0; r_rem := ratelimits_floor0_v1("L" - cnt);
                r_rty := least("P", __CONCURRENCY_RETRY_US__);
            END IF;
        ELSE
            RAISE EXCEPTION 'ratelimits: algorithm % is not decided by this engine', al
                USING ERRCODE = '22023';
        END IF;

        IF "W" > 0 AND p_stage[i] <> 2 THEN
            -- warm-up (algorithms.py `warm_check`): the base algorithm's figures above,
            -- behind a gate that paces a cold client
            "T" := "P" / "L";
            "C" := greatest("B", 1.0) * "T";
            SELECT s.v INTO st FROM ratelimits_state_v1 s
                WHERE s.k = key || ':w' AND s.expires > now;
            IF st IS NULL THEN wn := now; ww := "W"; ELSE wn := st[1]; ww := st[2]; END IF;
            IF wn < now THEN
                ww := least("W", ww + (now - wn) * "W" / "C");
                wn := now;
            END IF;
            IF ww > 0 THEN
                gap := "T" * (1 + 2 * ww / "W");
                IF now + __EPS__ + mw < wn THEN
                    horizon := ceil(wn - now + ("W" - ww) * "C" / "W");
                    IF a = 1 THEN  -- the base admitted: its write is not made
                        w_i := w_i[1:array_length(w_i, 1) - 1];
                        w_k := w_k[1:array_length(w_k, 1) - 1];
                        w_v := w_v[1:array_length(w_v, 1) - 1];
                        w_m := w_m[1:array_length(w_m, 1) - 1];
                        w_ttl := w_ttl[1:array_length(w_ttl, 1) - 1];
                    END IF;
                    r_rst := greatest(r_rst, horizon);
                    r_rty := greatest(r_rty, ceil(wn - now - mw));
                    a := 0; r_rem := 0; r_dly := 0;
                    gap := NULL;
                ELSE
                    n2 := wn + c * gap;
                    w2 := greatest(0.0, ww - c * gap);
                    r_dly := greatest(r_dly, CASE WHEN a = 1 THEN ceil(wn - now) ELSE 0 END);
                END IF;
            ELSE
                gap := 0;
                n2 := wn + c * "T";
                w2 := 0.0;
            END IF;
            IF gap IS NOT NULL THEN
                horizon := ceil(n2 - now + ("W" - w2) * "C" / "W");
                r_rst := greatest(r_rst, horizon);
                IF a = 1 THEN
                    IF w2 > 0 THEN r_rem := 0; END IF;
                    -- the state's own write keeps it until the later of the two resets
                    w_ttl[array_length(w_ttl, 1)] := r_rst;
                    w_i := w_i || i; w_k := w_k || (key || ':w');
                    w_v := w_v || ARRAY[n2, w2]::text; w_m := w_m || NULL::text;
                    w_ttl := w_ttl || r_rst;
                ELSE
                    r_dly := 0;
                END IF;
            END IF;
        END IF;

        IF p_lockout[i] > 0 AND p_stage[i] <> 2 THEN
            -- a lockout holding the client refuses whatever the check found
            SELECT s.v[1] INTO until FROM ratelimits_state_v1 s
                WHERE s.k = key || ':x' AND s.expires > now;
            IF until > now THEN
                a := 0; r_rem := 0; r_rst := greatest(r_rst, until - now);
                r_rty := until - now; r_dly := 0; is_locked := true;
            END IF;
        END IF;
        locked := locked || is_locked;
        ok := ok || a; rem := rem || r_rem; rst := rst || r_rst; rty := rty || r_rty;
        dly := dly || r_dly;
        IF a = 0 AND NOT p_shadow[i] THEN refused := true; END IF;
    END LOOP;

    admitted := NOT refused;
    IF refused THEN
        -- each enforced limit that refused starts its lockout, unless one holds already
        FOR i IN 1 .. nl LOOP
            IF ok[i] = 0 AND NOT p_shadow[i] AND p_lockout[i] > 0 AND NOT locked[i] THEN
                INSERT INTO ratelimits_state_v1 AS s (k, v, m, expires)
                    VALUES (p_keys[i] || ':x', ARRAY[now + p_lockout[i]], NULL,
                            ratelimits_expiry_v1(now, p_lockout[i]))
                    ON CONFLICT (k) DO UPDATE
                    SET v = excluded.v, m = excluded.m, expires = excluded.expires;
                rst[i] := greatest(rst[i], p_lockout[i]);
                rty[i] := greatest(rty[i], p_lockout[i]);
            END IF;
        END LOOP;
    END IF;
    IF admitted THEN
        FOR j IN 1 .. coalesce(array_length(w_i, 1), 0) LOOP
            IF ok[w_i[j]] = 1 THEN
                INSERT INTO ratelimits_state_v1 AS s (k, v, m, expires)
                    VALUES (w_k[j], w_v[j]::float8[], w_m[j]::text[],
                            ratelimits_expiry_v1(now, w_ttl[j]))
                    ON CONFLICT (k) DO UPDATE
                    SET v = excluded.v, m = excluded.m, expires = excluded.expires;
            END IF;
        END LOOP;
    END IF;

    remaining := '{}'; reset_after := rst; wait := '{}'; outcome := '{}';
    FOR i IN 1 .. nl LOOP
        IF p_stage[i] = 2 THEN
            outcome := outcome || 'o'::text; remaining := remaining || rem[i];
        ELSIF ok[i] = 1 AND admitted THEN
            outcome := outcome || 'a'::text; remaining := remaining || rem[i];
        ELSIF ok[i] = 1 THEN
            outcome := outcome || 'o'::text; remaining := remaining || (rem[i] + p_c[i]);
        ELSE
            outcome := outcome || CASE WHEN p_shadow[i] THEN 'w' ELSE 'r' END;
            remaining := remaining || rem[i];
        END IF;
        wait := wait || CASE WHEN ok[i] = 1 THEN dly[i] ELSE rty[i] END;
    END LOOP;

    IF p_version_key IS NOT NULL THEN
        SELECT coalesce(max(t.v), 0) INTO version FROM ratelimits_version_v1 t
            WHERE t.k = p_version_key;
    END IF;
END
$$;

-- Free the named slots of concurrency limits (each key's members, as one text array
-- per key, joined with a newline) or keep them another `period` from now (`p_renew`).
CREATE OR REPLACE FUNCTION ratelimits_slots_v1(
    p_now float8, p_keys text[], p_members text[], p_periods float8[], p_renew boolean,
    p_lock_ms int)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now float8 := coalesce(p_now, floor(extract(epoch FROM clock_timestamp())::float8 * 1000000));
    i int;
    st float8[];
    held text[];
    names text[];
BEGIN
    PERFORM ratelimits_lock_v1(p_keys, p_lock_ms);
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        names := string_to_array(p_members[i], E'\n');
        SELECT coalesce(array_agg(CASE WHEN p_renew AND mm = ANY (names)
                                           AND e < now + p_periods[i]
                                      THEN now + p_periods[i] ELSE e END ORDER BY o), '{}'),
               coalesce(array_agg(mm ORDER BY o), '{}')
            INTO st, held
            FROM ratelimits_state_v1 s, unnest(s.v, s.m) WITH ORDINALITY u(e, mm, o)
            WHERE s.k = p_keys[i] AND s.expires > now AND e > now
              AND (p_renew OR NOT mm = ANY (names));
        IF p_renew THEN
            UPDATE ratelimits_state_v1 SET v = st, m = held,
                expires = ratelimits_expiry_v1(now, p_periods[i])
                WHERE k = p_keys[i] AND expires > now AND m && names;
        ELSE
            UPDATE ratelimits_state_v1 SET v = st, m = held
                WHERE k = p_keys[i] AND expires > now;
        END IF;
    END LOOP;
END
$$;

-- Leases (engine/lease.py; the twin of lua/lease.lua, which says why each step is as
-- it is): per entry, first the give-back of `p_back` units to window `p_back_win` of
-- epoch `p_back_epoch` (only while that window is current, never below zero), then a
-- grant of min(`p_want`, what the window has left) units, at least the cost or none,
-- charged to the window's count that decisions read (`<key>:<window>`, v[1]), so
-- leased and unleased requests share one count. `p_want` = __LEASE_RESET__ resets the
-- client instead: the count keeps what leases of the last two lease periods may still
-- spend, the previous window goes, and the epoch moves on. What a window granted lives
-- in a row of its own, `<key>:<window>:l`, v = {lease period b, units granted in b, in
-- b - 1, epoch}, expiring with the window (a decision rewrites the window's row whole).
-- A calendar window is given as decisions get it (its number and its end, µs). Times
-- are µs; `p_now` NULL: the server's clock. The clients' locks (waited for at most
-- `p_lock_ms`) as `ratelimits_decide_v1` takes them.
CREATE OR REPLACE FUNCTION ratelimits_lease_v1(
    p_now float8, p_keys text[], p_algos text[], p_l float8[], p_p float8[], p_c float8[],
    p_want float8[], p_back_win float8[], p_back float8[], p_back_epoch float8[],
    p_cal_win float8[], p_cal_end float8[], p_lock_ms int,
    OUT now_us float8, OUT granted float8[], OUT win float8[], OUT remaining float8[],
    OUT reset_after float8[], OUT retry_after float8[], OUT ends_after float8[],
    OUT returned float8[], OUT epoch float8[])
LANGUAGE plpgsql AS $$
DECLARE
    now float8;
    i int;
    key text; wkey text; lkey text; al text;
    "L" float8; "P" float8; c float8; want float8;
    w float8; elapsed float8; ends float8; ttl float8;
    cur float8; prev float8; est float8; lft float8;
    rec float8[];
    ep float8; period float8; live float8;
    g float8; rem float8; rst float8; rty float8; ret float8;
BEGIN
    now := coalesce(p_now, floor(extract(epoch FROM clock_timestamp())::float8 * 1000000));
    now_us := now;
    PERFORM ratelimits_lock_v1(p_keys, p_lock_ms);
    granted := '{}'; win := '{}'; remaining := '{}'; reset_after := '{}';
    retry_after := '{}'; ends_after := '{}'; returned := '{}'; epoch := '{}';
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        key := p_keys[i]; al := p_algos[i];
        "L" := p_l[i]; "P" := p_p[i]; c := p_c[i]; want := p_want[i];
        IF al NOT IN ('fixed_window', 'sliding_window') THEN
            RAISE EXCEPTION 'ratelimits: a lease needs fixed_window or sliding_window, not %',
                al USING ERRCODE = '22023';
        END IF;
        IF p_cal_win[i] IS NULL THEN
            w := floor(now / "P");
            elapsed := now - w * "P";
            ends := "P" - elapsed;
        ELSE
            w := p_cal_win[i];
            elapsed := now - w * __US__;
            ends := p_cal_end[i] - now;
        END IF;
        -- what a grant's write keeps the window for, as a decision's write does
        ttl := CASE WHEN al = 'fixed_window' THEN ends ELSE 2 * "P" - elapsed END;
        wkey := key || ':' || w::bigint;
        lkey := wkey || ':l';
        SELECT s.v[1] INTO cur FROM ratelimits_state_v1 s WHERE s.k = wkey AND s.expires > now;
        cur := coalesce(cur, 0);
        SELECT s.v INTO rec FROM ratelimits_state_v1 s WHERE s.k = lkey AND s.expires > now;
        ep := coalesce(rec[4], 0);
        period := floor(now / __LEASE_US__);
        IF want = __LEASE_RESET__ THEN
            DELETE FROM ratelimits_state_v1 WHERE k IN (key || ':' || (w - 1)::bigint,
                                                        key || ':' || (w - 1)::bigint || ':l');
            IF rec IS NOT NULL THEN
                -- the units granted in the lease periods whose leases may still run
                live := CASE WHEN rec[1] >= period THEN rec[2] + rec[3]
                             WHEN rec[1] = period - 1 THEN rec[2] ELSE 0 END;
                cur := least(cur, live);
                IF cur > 0 THEN
                    UPDATE ratelimits_state_v1 SET v = ARRAY[cur] WHERE k = wkey;
                ELSE
                    DELETE FROM ratelimits_state_v1 WHERE k = wkey;
                END IF;
                ep := ep + 1;
                UPDATE ratelimits_state_v1 SET v[4] = ep WHERE k = lkey;
            ELSE  -- nothing leased in this window: nothing can be spent from it any more
                DELETE FROM ratelimits_state_v1 WHERE k = wkey;
                cur := 0;
            END IF;
            want := 0;
        END IF;
        ret := 0;
        IF p_back[i] > 0 AND p_back_win[i] = w AND p_back_epoch[i] = ep AND cur > 0 THEN
            ret := least(p_back[i], cur);
            cur := cur - ret;
            UPDATE ratelimits_state_v1 SET v = ARRAY[cur] WHERE k = wkey;  -- its expiry kept
        END IF;
        g := 0; rem := 0; rst := 0; rty := 0;
        IF al = 'fixed_window' THEN
            lft := "L" - cur;
            rst := ends;
            IF want > 0 AND lft >= c THEN
                g := least(want, lft);
            ELSIF want > 0 THEN
                rty := rst;
            END IF;
            rem := ratelimits_floor0_v1(lft - g);
        ELSE
            SELECT s.v[1] INTO prev FROM ratelimits_state_v1 s
                WHERE s.k = key || ':' || (w - 1)::bigint AND s.expires > now;
            prev := coalesce(prev, 0);
            est := prev * ("P" - elapsed) / "P" + cur;
            lft := floor("L" - est + __TOKEN_EPS__);
            IF want > 0 AND lft >= c THEN
                g := least(want, lft);
                rst := 2 * "P" - elapsed;
            ELSE
                IF want > 0 THEN
                    rty := ratelimits_sliding_retry_v1("L", "P", c, prev, cur, elapsed);
                END IF;
                rst := CASE WHEN cur > 0 THEN 2 * "P" - elapsed ELSE "P" - elapsed END;
            END IF;
            rem := ratelimits_floor0_v1("L" - est - g);
        END IF;
        IF g > 0 THEN
            INSERT INTO ratelimits_state_v1 AS s (k, v, m, expires)
                VALUES (wkey, ARRAY[cur + g], NULL, ratelimits_expiry_v1(now, ttl))
                ON CONFLICT (k) DO UPDATE
                SET v = excluded.v, m = NULL, expires = excluded.expires;
            -- the grant recorded in lease period `period` (a record behind it moves on)
            IF rec IS NULL THEN
                rec := ARRAY[period, g, 0, ep];
            ELSIF rec[1] >= period THEN
                rec[2] := rec[2] + g;
            ELSIF rec[1] = period - 1 THEN
                rec := ARRAY[period, g, rec[2], ep];
            ELSE
                rec := ARRAY[period, g, 0, ep];
            END IF;
            INSERT INTO ratelimits_state_v1 AS s (k, v, m, expires)
                VALUES (lkey, rec, NULL, ratelimits_expiry_v1(now, ttl))
                ON CONFLICT (k) DO UPDATE
                SET v = excluded.v, m = NULL, expires = excluded.expires;
        END IF;
        granted := granted || g; win := win || w; remaining := remaining || rem;
        reset_after := reset_after || rst; retry_after := retry_after || rty;
        ends_after := ends_after || ends; returned := returned || ret; epoch := epoch || ep;
    END LOOP;
END
$$;

-- Forget one client's state: its key and every key under it (its windows, its warm-up,
-- its lockout), under the client's lock, as a decision takes it.
CREATE OR REPLACE FUNCTION ratelimits_reset_v1(p_key text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    gone bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(__LOCK_SPACE__, hashtext(p_key));
    DELETE FROM ratelimits_state_v1
        WHERE k = p_key OR (k >= p_key || ':' AND k < p_key || ';');
    GET DIAGNOSTICS gone = ROW_COUNT;
    RETURN gone;
END
$$;

-- One beat of process `p_member` in group `p_grp`: its row written at the server's time,
-- the rows silent for `p_ttl` µs deleted; how many processes beat within it.
CREATE OR REPLACE FUNCTION ratelimits_beat_v1(p_grp text, p_member text, p_ttl float8)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    now float8 := floor(extract(epoch FROM clock_timestamp())::float8 * 1000000);
    live bigint;
BEGIN
    INSERT INTO ratelimits_live_v1 AS t (grp, member, seen) VALUES (p_grp, p_member, now)
        ON CONFLICT (grp, member) DO UPDATE SET seen = excluded.seen;
    DELETE FROM ratelimits_live_v1 t WHERE t.grp = p_grp AND t.seen <= now - p_ttl;
    SELECT count(*) INTO live FROM ratelimits_live_v1 t WHERE t.grp = p_grp;
    RETURN live;
END
$$;

-- Delete at most `p_limit` rows past their expiry from each table; rows another
-- transaction holds are left to a later sweep rather than waited for.
CREATE OR REPLACE FUNCTION ratelimits_sweep_v1(p_now float8, p_limit int) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    now float8 := coalesce(p_now, floor(extract(epoch FROM clock_timestamp())::float8 * 1000000));
    gone bigint;
    more bigint;
BEGIN
    DELETE FROM ratelimits_state_v1 WHERE k IN (
        SELECT k FROM ratelimits_state_v1 WHERE expires <= now
        ORDER BY expires LIMIT p_limit FOR UPDATE SKIP LOCKED) AND expires <= now;
    GET DIAGNOSTICS gone = ROW_COUNT;
    DELETE FROM ratelimits_counts_v1 WHERE (name, minute, field) IN (
        SELECT name, minute, field FROM ratelimits_counts_v1 WHERE expires <= now
        ORDER BY expires LIMIT p_limit FOR UPDATE SKIP LOCKED) AND expires <= now;
    GET DIAGNOSTICS more = ROW_COUNT;
    gone := gone + more;
    DELETE FROM ratelimits_offenders_v1 WHERE (name, hour, who) IN (
        SELECT name, hour, who FROM ratelimits_offenders_v1 WHERE expires <= now
        ORDER BY expires LIMIT p_limit FOR UPDATE SKIP LOCKED) AND expires <= now;
    GET DIAGNOSTICS more = ROW_COUNT;
    RETURN gone + more;
END
$$;

-- Add what a process tallied (engine/tally.py) to the per-minute counters and to the
-- hourly offenders, in key order (two senders never deadlock). A minute's counters are
-- kept `STATS_TTL` after it starts, an hour's offenders `OFFENDERS_TTL` after it ends.
-- Each policy-hour keeps at most `OFFENDERS_CAP` offenders, as lua/prelude.lua's
-- `offend` keeps them (Space-Saving): a newcomer to a full list takes the place of the
-- least refused (ties: the smallest name) and inherits its count as its error.
CREATE OR REPLACE FUNCTION ratelimits_count_v1(
    p_names text[], p_minutes bigint[], p_fields text[], p_ns bigint[],
    p_onames text[], p_hours bigint[], p_whos text[], p_ons bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    h int;
    o record;
    members int;
    inherited bigint;
BEGIN
    INSERT INTO ratelimits_counts_v1 AS t (name, minute, field, n, expires)
        SELECT nm, mi, f, sum(x), (mi * 60 + __STATS_TTL__)::float8 * 1000000
        FROM unnest(p_names, p_minutes, p_fields, p_ns) u(nm, mi, f, x)
        GROUP BY nm, mi, f ORDER BY nm, mi, f
        ON CONFLICT (name, minute, field) DO UPDATE SET n = t.n + excluded.n;
    FOR h IN SELECT DISTINCT hashtext(nm || ':' || hr) FROM unnest(p_onames, p_hours) u(nm, hr)
             ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(__LOCK_SPACE__ + 1, h);
    END LOOP;
    FOR o IN SELECT nm, hr, who, sum(x)::bigint AS x
             FROM unnest(p_onames, p_hours, p_whos, p_ons) u(nm, hr, who, x)
             GROUP BY nm, hr, who ORDER BY nm, hr, who LOOP
        UPDATE ratelimits_offenders_v1 t SET n = t.n + o.x
            WHERE t.name = o.nm AND t.hour = o.hr AND t.who = o.who;
        CONTINUE WHEN FOUND;
        inherited := 0;
        SELECT count(*) INTO members FROM ratelimits_offenders_v1 t
            WHERE t.name = o.nm AND t.hour = o.hr;
        IF members >= __OFFENDERS_CAP__ THEN
            DELETE FROM ratelimits_offenders_v1 t WHERE t.name = o.nm AND t.hour = o.hr
                AND t.who = (SELECT t2.who FROM ratelimits_offenders_v1 t2
                             WHERE t2.name = o.nm AND t2.hour = o.hr
                             ORDER BY t2.n, t2.who LIMIT 1)
                RETURNING t.n INTO inherited;
        END IF;
        INSERT INTO ratelimits_offenders_v1 (name, hour, who, n, e, expires)
            VALUES (o.nm, o.hr, o.who, inherited + o.x, inherited,
                    ((o.hr + 1) * 3600 + __OFFENDERS_TTL__)::float8 * 1000000);
    END LOOP;
END
$$;
