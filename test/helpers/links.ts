// The relative links of the documentation, as test/links.test.ts checks
// them: every link of README.md and docs/**/*.md that is not a URL must name
// a file or directory of the repository, and its `#anchor`, in the same page
// or in another .md page, must be the slug of one of that page's headings, as
// GitHub makes them: the heading's text as rendered (no backticks, emphasis
// or link targets), lowercased, every character that is not a letter, a
// digit, a space, `-` or `_` dropped, spaces turned into `-`; the second
// heading with the same slug gets `-1`, the third `-2`.
//
// Code blocks and inline code are not read: a `#` line in a shell block is
// no heading, and a `[a](b)` in code is no link.

import { existsSync, readFileSync } from 'node:fs'
import { dirname, join, normalize } from 'node:path'

/** The lines of a page outside fenced code blocks (blanked, so line numbers hold). */
function prose (text: string): string[] {
  const lines = text.split('\n')
  let fence: string | undefined
  return lines.map((line) => {
    const open = /^\s*(`{3,}|~{3,})/.exec(line)
    if (fence === undefined) {
      if (open !== null) {
        fence = open[1] as string
        return ''
      }
      return line
    }
    if (line.trim() === fence) fence = undefined
    return ''
  })
}

/** A heading's text as GitHub renders it, then its slug (before duplicates are numbered). */
export function slug (heading: string): string {
  const rendered = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // links and images: their text
    .replace(/<[^>]+>/g, '') // inline HTML
    .replace(/`/g, '')
  return rendered.trim().toLowerCase().replace(/[^\p{L}\p{N}\p{M} _-]/gu, '').replace(/ /g, '-')
}

/** The anchors a page's headings make, in order, duplicates numbered. */
export function anchors (text: string): string[] {
  const seen = new Map<string, number>()
  const out: string[] = []
  for (const line of prose(text)) {
    const heading = /^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)
    if (heading === null) continue
    const base = slug(heading[1] as string)
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    out.push(n === 0 ? base : `${base}-${n}`)
  }
  return out
}

export interface Link {
  /** 1-based line of the page. */
  line: number
  target: string
}

/** The links of a page that are not URLs (`http:`, `mailto:` and the like): inline links and images, and reference definitions. */
export function relativeLinks (text: string): Link[] {
  const out: Link[] = []
  prose(text).forEach((raw, i) => {
    const line = raw.replace(/(`+)[\s\S]*?\1/g, '') // inline code
    const found = [
      ...[...line.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1] as string),
      ...[...line.matchAll(/^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+"[^"]*")?\s*$/g)].map((m) => m[1] as string),
      ...[...line.matchAll(/\b(?:href|src)="([^"]+)"/g)].map((m) => m[1] as string)
    ]
    for (const target of found) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue
      out.push({ line: i + 1, target })
    }
  })
  return out
}

/**
 * What is wrong with the links of the page `file` (a path from `root`), one
 * line each: `file:line: target: why`. Empty when every link holds.
 */
export function deadLinks (root: string, file: string): string[] {
  const read = (path: string): string => readFileSync(path, 'utf8')
  const problems: string[] = []
  const text = read(join(root, file))
  const pages = new Map<string, string[]>()
  const anchorsOf = (path: string): string[] => {
    let found = pages.get(path)
    if (found === undefined) {
      found = anchors(read(join(root, path)))
      pages.set(path, found)
    }
    return found
  }
  for (const { line, target } of relativeLinks(text)) {
    const hash = target.indexOf('#')
    const pathPart = hash === -1 ? target : target.slice(0, hash)
    const anchor = hash === -1 ? undefined : decodeURIComponent(target.slice(hash + 1))
    const path = pathPart === '' ? file : normalize(join(dirname(file), decodeURIComponent(pathPart))).split('\\').join('/')
    const where = `${file}:${line}: ${target}`
    if (path.startsWith('..')) {
      problems.push(`${where}: outside the repository`)
      continue
    }
    if (!existsSync(join(root, path))) {
      problems.push(`${where}: no such file`)
      continue
    }
    if (anchor === undefined) continue
    if (!path.endsWith('.md')) {
      problems.push(`${where}: an anchor into a file that is not a .md page`)
      continue
    }
    if (!anchorsOf(path).includes(anchor)) problems.push(`${where}: no heading of ${path} has the anchor #${anchor}`)
  }
  return problems
}
