//! The page registry (pure): which of the program's pages have been moved
//! onto which shared backing, and how many registrations hold each page.
//!
//! Overlapping registrations are common (perftest registers overlapping
//! buffers, many programs put two regions on one page), and every region
//! over a page must see the same bytes as the program: so a page is moved
//! once, onto one backing, and later registrations of it share that backing
//! and count a reference. The registry keeps disjoint *runs* of pages (a
//! run: consecutive program pages on consecutive pages of one backing, all
//! with the same count); it splits and merges runs as counts change.
//!
//! A run can go *stale*: the program unmapped the pages (or mapped
//! something else over them) while regions still held them. The caller
//! finds that out ([`super`] compares the program's mappings) and evicts
//! the run ([`PageRegistry::evict`]): the regions that held it keep their
//! backing (they hold it themselves), a new registration gets a new one,
//! and the old regions' releases, which name the backing they held, leave
//! the new run alone.

use std::collections::BTreeMap;

/// One run: `pages` program pages from its key on, on pages `offset..` of
/// `backing`, held by `refs` registrations.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run<B> {
    pages: u64,
    backing: B,
    offset: u64,
    refs: u32,
}

/// What lies on a range of program pages ([`PageRegistry::pieces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<B> {
    /// Pages `first..first + pages` are on pages `offset..` of `backing`.
    Held {
        /// First program page.
        first: u64,
        /// Pages.
        pages: u64,
        /// Their backing.
        backing: B,
        /// Page offset of `first` in the backing.
        offset: u64,
    },
    /// Pages `first..first + pages` are not in the registry.
    Gap {
        /// First program page.
        first: u64,
        /// Pages.
        pages: u64,
    },
}

/// The registry: disjoint runs keyed by their first program page (a page
/// number: address / page size). `B` names a backing (compared with `==`).
#[derive(Debug, Clone)]
pub struct PageRegistry<B> {
    runs: BTreeMap<u64, Run<B>>,
}

impl<B> Default for PageRegistry<B> {
    fn default() -> Self {
        PageRegistry {
            runs: BTreeMap::new(),
        }
    }
}

impl<B: Clone + PartialEq> PageRegistry<B> {
    /// An empty registry.
    pub const fn new() -> Self {
        PageRegistry {
            runs: BTreeMap::new(),
        }
    }

    /// Runs in the registry (for tests and diagnostics).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Whether no page is registered.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Every run as (first page, pages, backing, offset, refs), in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, &B, u64, u32)> {
        self.runs
            .iter()
            .map(|(&f, r)| (f, r.pages, &r.backing, r.offset, r.refs))
    }

    /// What lies on pages `first..first + pages`, in order, gaps included.
    pub fn pieces(&self, first: u64, pages: u64) -> Vec<Piece<B>> {
        let end = first.saturating_add(pages);
        let mut out = Vec::new();
        let mut at = first;
        // The run that starts before `first` may cover it.
        let start = self
            .runs
            .range(..=first)
            .next_back()
            .filter(|(&f, r)| f + r.pages > first)
            .map_or(first, |(&f, _)| f);
        for (&f, r) in self.runs.range(start..end) {
            let (lo, hi) = (f.max(first), (f + r.pages).min(end));
            if lo >= hi {
                continue;
            }
            if lo > at {
                out.push(Piece::Gap {
                    first: at,
                    pages: lo - at,
                });
            }
            out.push(Piece::Held {
                first: lo,
                pages: hi - lo,
                backing: r.backing.clone(),
                offset: r.offset + (lo - f),
            });
            at = hi;
        }
        if at < end {
            out.push(Piece::Gap {
                first: at,
                pages: end - at,
            });
        }
        out
    }

    /// Splits the run covering `page` (if any, and if it starts before it)
    /// so that a run starts at `page`.
    fn split_at(&mut self, page: u64) {
        let Some((&f, r)) = self.runs.range(..page).next_back() else {
            return;
        };
        if f + r.pages <= page {
            return;
        }
        let mut tail = r.clone();
        let head = page - f;
        tail.pages -= head;
        tail.offset += head;
        if let Some(r) = self.runs.get_mut(&f) {
            r.pages = head;
        }
        self.runs.insert(page, tail);
    }

    /// Merges runs around `first..end` that continue each other (same
    /// backing, consecutive offsets, same count), to keep the map small.
    fn merge_around(&mut self, first: u64, end: u64) {
        let from = self
            .runs
            .range(..first)
            .next_back()
            .map_or(first, |(&f, _)| f);
        let keys: Vec<u64> = self.runs.range(from..=end).map(|(&f, _)| f).collect();
        let mut prev: Option<u64> = None;
        for k in keys {
            if let Some(p) = prev {
                let (Some(a), Some(b)) = (self.runs.get(&p), self.runs.get(&k)) else {
                    prev = Some(k);
                    continue;
                };
                if p + a.pages == k
                    && a.backing == b.backing
                    && a.offset + a.pages == b.offset
                    && a.refs == b.refs
                {
                    let n = b.pages;
                    self.runs.remove(&k);
                    if let Some(a) = self.runs.get_mut(&p) {
                        a.pages += n;
                    }
                    continue;
                }
            }
            prev = Some(k);
        }
    }

    /// Puts pages `first..first + pages` (a gap: no page of it is in the
    /// registry) on pages `offset..` of `backing`, held by nobody yet.
    /// False (and nothing done) if a page of it is registered.
    pub fn insert(&mut self, first: u64, pages: u64, backing: B, offset: u64) -> bool {
        if pages == 0 || !matches!(self.pieces(first, pages)[..], [Piece::Gap { .. }]) {
            return false;
        }
        self.runs.insert(
            first,
            Run {
                pages,
                backing,
                offset,
                refs: 0,
            },
        );
        true
    }

    /// Counts one more registration on every page of `first..first +
    /// pages`; false (and nothing done) unless every page is registered.
    pub fn hold(&mut self, first: u64, pages: u64) -> bool {
        let end = first.saturating_add(pages);
        if pages == 0
            || self
                .pieces(first, pages)
                .iter()
                .any(|p| matches!(p, Piece::Gap { .. }))
        {
            return false;
        }
        self.split_at(first);
        self.split_at(end);
        for (_, r) in self.runs.range_mut(first..end) {
            r.refs += 1;
        }
        self.merge_around(first, end);
        true
    }

    /// Counts one registration less on the pages of `first..first + pages`
    /// that are on `backing` (pages since evicted and moved again are on
    /// another one and stay as they are); runs no registration holds any
    /// more leave the registry. Returns the ranges (first page, pages,
    /// backing offset) that left.
    pub fn release(&mut self, first: u64, pages: u64, backing: &B) -> Vec<(u64, u64, u64)> {
        let end = first.saturating_add(pages);
        if pages == 0 {
            return Vec::new();
        }
        self.split_at(first);
        self.split_at(end);
        let mut gone = Vec::new();
        for (&f, r) in self.runs.range_mut(first..end) {
            if r.backing == *backing && r.refs > 0 {
                r.refs -= 1;
                if r.refs == 0 {
                    gone.push((f, r.pages, r.offset));
                }
            }
        }
        for (f, _, _) in &gone {
            self.runs.remove(f);
        }
        self.merge_around(first, end);
        gone
    }

    /// Forgets pages `first..first + pages` whatever holds them (the
    /// program's mapping there is no longer the backing's).
    pub fn evict(&mut self, first: u64, pages: u64) {
        let end = first.saturating_add(pages);
        self.split_at(first);
        self.split_at(end);
        let keys: Vec<u64> = self.runs.range(first..end).map(|(&f, _)| f).collect();
        for k in keys {
            self.runs.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(first: u64, pages: u64, backing: u32, offset: u64) -> Piece<u32> {
        Piece::Held {
            first,
            pages,
            backing,
            offset,
        }
    }

    #[test]
    fn pieces_of_an_empty_registry_are_one_gap() {
        let r = PageRegistry::<u32>::new();
        assert_eq!(
            r.pieces(10, 3),
            vec![Piece::Gap {
                first: 10,
                pages: 3
            }]
        );
    }

    #[test]
    fn overlapping_registrations_share_pages_and_count() {
        let mut r = PageRegistry::new();
        // Region A: pages 10..14 on backing 1.
        assert!(r.insert(10, 4, 1u32, 0));
        assert!(r.hold(10, 4));
        // Region B: pages 12..16: 12..14 held, 14..16 a gap.
        assert_eq!(
            r.pieces(12, 4),
            vec![
                held(12, 2, 1, 2),
                Piece::Gap {
                    first: 14,
                    pages: 2
                }
            ]
        );
        assert!(
            !r.insert(12, 4, 2, 0),
            "an insert over held pages is refused"
        );
        assert!(r.insert(14, 2, 2, 0));
        assert!(r.hold(12, 4));
        let runs: Vec<_> = r.iter().map(|(f, p, &b, o, n)| (f, p, b, o, n)).collect();
        assert_eq!(
            runs,
            vec![(10, 2, 1, 0, 1), (12, 2, 1, 2, 2), (14, 2, 2, 0, 1)]
        );
        // A goes: pages 10..12 leave, 12..14 stay for B.
        assert_eq!(r.release(10, 4, &1), vec![(10, 2, 0)]);
        assert_eq!(r.pieces(12, 4), vec![held(12, 2, 1, 2), held(14, 2, 2, 0)]);
        assert_eq!(
            r.pieces(10, 2),
            vec![Piece::Gap {
                first: 10,
                pages: 2
            }]
        );
        // B goes (its pages are on two backings): everything leaves.
        let mut gone = r.release(12, 2, &1);
        gone.extend(r.release(14, 2, &2));
        assert_eq!(gone, vec![(12, 2, 2), (14, 2, 0)]);
        assert!(r.is_empty());
    }

    #[test]
    fn identical_registrations_merge_back_into_one_run() {
        let mut r = PageRegistry::new();
        assert!(r.insert(0, 8, 7u32, 0));
        for _ in 0..3 {
            assert!(r.hold(0, 8));
        }
        // A region on one page in the middle splits, then merges back.
        assert!(r.hold(3, 1));
        assert_eq!(r.runs(), 3);
        assert!(r.release(3, 1, &7).is_empty());
        assert_eq!(r.runs(), 1);
        assert!(r.release(0, 8, &7).is_empty());
        assert!(r.release(0, 8, &7).is_empty());
        assert_eq!(r.release(0, 8, &7), vec![(0, 8, 0)]);
        assert!(r.is_empty());
    }

    #[test]
    fn hold_needs_every_page_registered() {
        let mut r = PageRegistry::new();
        assert!(r.insert(0, 2, 1u32, 0));
        assert!(!r.hold(0, 3));
        assert!(!r.hold(5, 0));
        assert!(r.iter().all(|(_, _, _, _, n)| n == 0), "nothing counted");
    }

    #[test]
    fn a_stale_run_evicted_leaves_the_new_backing_to_its_own_regions() {
        let mut r = PageRegistry::new();
        assert!(r.insert(4, 4, 1u32, 0));
        assert!(r.hold(4, 4));
        // The program unmapped pages 5..7 and registers them again.
        r.evict(5, 2);
        assert_eq!(
            r.pieces(4, 4),
            vec![
                held(4, 1, 1, 0),
                Piece::Gap { first: 5, pages: 2 },
                held(7, 1, 1, 3)
            ]
        );
        assert!(r.insert(5, 2, 2, 0));
        assert!(r.hold(5, 2));
        // The old region's release does not touch the new backing's pages.
        assert_eq!(r.release(4, 4, &1), vec![(4, 1, 0), (7, 1, 3)]);
        assert_eq!(r.pieces(5, 2), vec![held(5, 2, 2, 0)]);
        assert_eq!(r.release(5, 2, &2), vec![(5, 2, 0)]);
        assert!(r.is_empty());
    }

    #[test]
    fn ranges_at_the_top_of_the_page_space_do_not_overflow() {
        let mut r = PageRegistry::new();
        let top = u64::MAX - 2;
        assert!(r.insert(top, 2, 1u32, 0));
        assert!(r.hold(top, 2));
        assert_eq!(r.pieces(top, 2), vec![held(top, 2, 1, 0)]);
        assert_eq!(r.release(top, 2, &1), vec![(top, 2, 0)]);
    }
}
