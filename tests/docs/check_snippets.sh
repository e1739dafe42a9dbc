#!/usr/bin/env bash
# The docs' YAML and shell snippets against the built CLI:
# - a ```yaml block is a job file and must pass `distopt check`; one whose
#   first line says `# snippet: under KEY` is the inside of section KEY and is
#   checked as `KEY:` followed by it; `# snippet: fragment` is not checked.
# - in a ```sh / ```bash block, every `distopt SUB [SUBSUB] --flag` must name a
#   real subcommand, and each --flag must appear in that subcommand's --help.
# - every relative link [text](FILE#anchor) names a file that exists and a
#   heading of it (GitHub's anchors).
# (The ```cpp blocks are compiled by the build: extract_cpp_snippets.sh.)
#   check_snippets.sh DISTOPT FILE.md...
set -uo pipefail
cli=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Each block to $work/NNN.{yaml,sh}; its origin "FILE:LINE" to $work/NNN.from.
awk -v dir="$work" '
FNR == 1 { inblock = 0 }
!inblock && match($0, /^[ \t]*```(yaml|sh|bash)[ \t]*$/) {
  indent = index($0, "`") - 1
  lang = $0; sub(/^[ \t]*```/, "", lang); sub(/[ \t]*$/, "", lang)
  if (lang == "bash") lang = "sh"
  n++; f = sprintf("%s/%03d.%s", dir, n, lang); inblock = 1
  printf "%s:%d\n", FILENAME, FNR > sprintf("%s/%03d.from", dir, n)
  printf "" > f
  next
}
inblock && /^[ \t]*```[ \t]*$/ { inblock = 0; close(f); next }
inblock { print substr($0, indent + 1) > f }
' "$@"

fail=0 yaml=0 cmds=0 skipped=0
plugin_args=()
[ -n "${DISTOPT_PLUGIN_DIR:-}" ] && plugin_args=(--plugin-path "$DISTOPT_PLUGIN_DIR")
for f in "$work"/*.yaml; do
  [ -e "$f" ] || break
  from=$(cat "${f%.yaml}.from")
  first=$(head -n 1 "$f")
  job=$f
  case "$first" in
    *"# snippet: fragment"*) skipped=$((skipped + 1)); continue ;;
    *"# snippet: under "*)
      key=${first##*# snippet: under }
      key=${key%% *}
      job=${f%.yaml}.job.yaml
      { echo "$key:"; sed 's/^/  /' "$f"; } >"$job" ;;
  esac
  yaml=$((yaml + 1))
  # A job file's relative paths are relative to it. The relative
  # plugins.paths directories a block names stand for the reader's own:
  # create them, empty, beside it (check refuses a missing one).
  sed -n 's/^[[:space:]]*paths:[[:space:]]*\[\([^]]*\)\].*/\1/p' "$job" | tr ',' '\n' |
    sed "s/^[[:space:]]*//; s/[[:space:]]*\$//; s/^[\"']//; s/[\"']\$//" |
    while read -r d; do
      case $d in /* | '') ;; *) mkdir -p "$(dirname "$job")/$d" ;; esac
    done
  if ! out=$("$cli" check "$job" "${plugin_args[@]}" 2>&1); then
    echo "FAIL $from: distopt check refuses this yaml block:"
    sed 's/^/    /' "$f"
    echo "  $out"
    fail=1
  fi
done

# `distopt` command lines in shell blocks.
declare -A helps
help_of() {  # the --help text of "SUB [SUBSUB]" into $help (cached: one run each)
  if [ -z "${helps[$1]+x}" ]; then
    # shellcheck disable=SC2086
    helps[$1]=$("$cli" $1 --help 2>&1) || helps[$1]="FAILED"
  fi
  help=${helps[$1]}
}
top_help=$("$cli" --help 2>&1)
subs=$(awk '/^commands:/ { on = 1; next } on && NF { print $1 }' <<<"$top_help" | grep -v '^`')
for f in "$work"/*.sh; do
  [ -e "$f" ] || break
  from=$(cat "${f%.sh}.from")
  while IFS= read -r line; do
    line=${line%%#*}  # comments
    # every "distopt ..." on the line (a path before it is fine: build/bin/distopt)
    while [[ $line =~ (^|[ /])distopt[[:space:]]+([^|;&]*) ]]; do
      rest=${BASH_REMATCH[2]}
      line=${line#*"${BASH_REMATCH[0]}"}
      rest=${rest%% -- *}  # the launched program's own arguments
      read -r -a words <<<"$rest"
      [ ${#words[@]} -gt 0 ] || continue
      cmds=$((cmds + 1))
      sub=${words[0]}
      if [[ $sub == -* ]]; then
        [[ $top_help == *"$sub"* ]] || {
          echo "FAIL $from: 'distopt $sub' is not a distopt option"
          fail=1
        }
        continue
      fi
      if ! grep -qx -- "$sub" <<<"$subs"; then
        echo "FAIL $from: 'distopt $sub': no such subcommand (have: $(echo $subs))"
        fail=1
        continue
      fi
      cmd=$sub
      # Subcommands with subcommands of their own take the next word.
      help_of "$sub"
      if [ ${#words[@]} -gt 1 ] && [[ ${words[1]} != -* ]] &&
        { [[ $help == *"distopt $sub ${words[1]}"* ]] ||
          grep -qE "^  ${words[1]}( |$)" <<<"$help"; }; then
        cmd="$sub ${words[1]}"
      fi
      help_of "$cmd"
      text=$help
      for w in "${words[@]:1}"; do
        [[ $w == --* ]] || continue
        flag=${w%%=*}
        if [[ $text != *"$flag"* ]]; then
          echo "FAIL $from: 'distopt $cmd $flag': $flag is not in 'distopt $cmd --help'"
          fail=1
        fi
      done
    done
  done <"$f"
done

# Relative links and their anchors.
links=0
anchors_of() {  # GitHub's heading anchors of a markdown file, one a line
  grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ //' | tr 'A-Z' 'a-z' |
    sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'
}
for md in "$@"; do
  dir=$(dirname "$md")
  while IFS= read -r target; do
    links=$((links + 1))
    file=${target%%#*}
    anchor=""
    [[ $target == *"#"* ]] && anchor=${target#*#}
    path=$md
    [ -n "$file" ] && path=$dir/$file
    if [ ! -e "$path" ]; then
      echo "FAIL $md: link to $target: no file $path"
      fail=1
    elif [ -n "$anchor" ] && ! anchors_of "$path" | grep -qx -- "$anchor"; then
      echo "FAIL $md: link to $target: no heading with anchor '$anchor' in $path"
      fail=1
    fi
  done < <(grep -oE '\]\([^) ]+\)' "$md" | sed -E 's/^\]\(//; s/\)$//' | grep -vE '^[a-z]+:')
done

echo "checked $links relative link(s)"
echo "checked $yaml yaml block(s) with distopt check ($skipped fragment(s) not checked)," \
  "$cmds distopt command line(s)"
[ "$yaml" -gt 0 ] && [ "$cmds" -gt 0 ] || { echo "FAIL: found no snippets"; fail=1; }
exit $fail
