-- The catalog of the `sweep` schema as text, one line per object, in a fixed order: what a
-- migration chain built, to compare with what another built (runner/tests/queue_migrations.rs,
-- `the_baseline_builds_the_schema_the_chain_built`; scripts/schema-catalog.sh writes it).
--
-- Everything a migration makes: relations (tables, partitions, indexes, sequences) with their
-- kind, options, privileges and partitioning; columns in order with type, nullability,
-- default, generation and identity; constraints; index definitions; sequences; triggers;
-- types; comments. Left out: sqlx's bookkeeping table, the day partitions of finished tasks
-- (`finished_tasks_YYYYMMDD`, named by the day they were made: retention's, not a
-- migration's), functions (installed from runner/sql/, not by migrations) and owners (the
-- role that migrated).
with rels as (
    select c.oid, c.relname, c.relkind, c.relpersistence, c.reloptions, c.relacl,
           c.relrowsecurity, c.relpartbound
    from pg_class c
    where c.relnamespace = 'sweep'::regnamespace
      and c.relname !~ '^_sqlx_migrations'
      and c.relname !~ '^finished_tasks_[0-9]{8}(_|$)'
      and c.relkind in ('r', 'p', 'i', 'I', 'S', 'v', 'm', 'f', 'c')
),
lines as (
    select 1 as section, n.nspname as key,
           format('schema %s acl=%s comment=%s', n.nspname, n.nspacl,
                  obj_description(n.oid, 'pg_namespace')) as line
    from pg_namespace n where n.nspname = 'sweep'
    union all
    select 2, r.relname,
           format('relation %s kind=%s persistence=%s options=%s acl=%s row_security=%s '
                  'partition_key=%s partition_of=%s bound=%s comment=%s',
                  r.relname, r.relkind, r.relpersistence, r.reloptions, r.relacl, r.relrowsecurity,
                  case when r.relkind = 'p' then pg_get_partkeydef(r.oid) end,
                  (select i.inhparent::regclass::text from pg_inherits i where i.inhrelid = r.oid),
                  pg_get_expr(r.relpartbound, r.oid),
                  obj_description(r.oid, 'pg_class'))
    from rels r
    union all
    select 3, r.relname || lpad(ordinal::text, 4, '0'),
           format('column %s.%s #%s %s notnull=%s default=%s generated=%s identity=%s '
                  'collation=%s comment=%s',
                  r.relname, a.attname, ordinal, format_type(a.atttypid, a.atttypmod),
                  a.attnotnull, pg_get_expr(d.adbin, d.adrelid), nullif(a.attgenerated, ''),
                  nullif(a.attidentity, ''),
                  case when a.attcollation <> t.typcollation then a.attcollation::regcollation end,
                  col_description(r.oid, a.attnum))
    from rels r
    cross join lateral (
        select a.*, row_number() over (order by a.attnum) as ordinal
        from pg_attribute a
        where a.attrelid = r.oid and a.attnum > 0 and not a.attisdropped
    ) a
    join pg_type t on t.oid = a.atttypid
    left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
    where r.relkind in ('r', 'p', 'v', 'm', 'f', 'c')
    union all
    select 4, r.relname || ' ' || co.conname,
           format('constraint %s.%s type=%s local=%s inherited=%s validated=%s %s',
                  r.relname, co.conname, co.contype, co.conislocal, co.coninhcount,
                  co.convalidated, pg_get_constraintdef(co.oid))
    from pg_constraint co
    join rels r on r.oid = co.conrelid
    union all
    select 5, r.relname,
           format('index %s on %s unique=%s primary=%s parent=%s: %s',
                  r.relname, i.indrelid::regclass, i.indisunique, i.indisprimary,
                  (select h.inhparent::regclass::text from pg_inherits h where h.inhrelid = r.oid),
                  pg_get_indexdef(r.oid))
    from rels r
    join pg_index i on i.indexrelid = r.oid
    union all
    select 6, r.relname,
           format('sequence %s type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s '
                  'owned_by=%s',
                  r.relname, format_type(s.seqtypid, null), s.seqstart, s.seqincrement,
                  s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
                  (select dc.relname || '.' || a.attname
                   from pg_depend dp
                   join pg_class dc on dc.oid = dp.refobjid
                   join pg_attribute a on a.attrelid = dp.refobjid and a.attnum = dp.refobjsubid
                   where dp.classid = 'pg_class'::regclass and dp.objid = r.oid
                     and dp.refclassid = 'pg_class'::regclass and dp.deptype in ('a', 'i')))
    from rels r
    join pg_sequence s on s.seqrelid = r.oid
    union all
    select 7, tg.tgname, format('trigger %s: %s', tg.tgname, pg_get_triggerdef(tg.oid))
    from pg_trigger tg
    join rels r on r.oid = tg.tgrelid
    where not tg.tgisinternal
    union all
    select 8, ty.typname, format('type %s kind=%s', ty.typname, ty.typtype)
    from pg_type ty
    where ty.typnamespace = 'sweep'::regnamespace
      and ty.typtype in ('e', 'd', 'r', 'm')
)
select line from lines order by section, key, line;
