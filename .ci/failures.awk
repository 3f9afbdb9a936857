# Lists the failing assertions of a tap log (tap 14 output, subtests
# indented 4 spaces a level): each failure under the names of the
# subtests it sits in, with its YAML diagnostic (where, what was
# compared, the diff), so a failure is readable from the end of a long
# run. A failing subtest or file is named on one line; a file that failed
# with no failing assertion (a crash, a timeout) also gets its exit code
# and signal.
function depth(s) { match(s, /^ */); return int(RLENGTH / 4) }
{ gsub(/\x1b\[[0-9;?]*[A-Za-z]/, "") }
/^ *# Subtest: / {
  d = depth($0); name = $0; sub(/^ *# Subtest: /, "", name); path[d] = name
  next
}
/^ *not ok [0-9]+/ {
  d = depth($0); where = ""
  for (i = 0; i < d; i++) where = where path[i] " > "
  title = $0; sub(/^ *not ok [0-9]+ - ?/, "", title)
  leaf = (title !~ / # time=[0-9.]+m?s$/)
  print (leaf ? "not ok: " : "failed: ") where title
  opened = 1; yaml = 0; lines = 0; indent = d * 4 + 2; next
}
opened { opened = 0; if ($0 ~ /^ *---$/) { yaml = 1; next } }
yaml && /^ *\.\.\.$/ { yaml = 0; next }
yaml {
  if (leaf && lines < 40) { print "    " substr($0, indent + 1); lines++ }
  else if (!leaf && d == 0 && $0 ~ /^ *(exitCode|signal|timeout):/) print "    " substr($0, indent + 1)
  next
}
