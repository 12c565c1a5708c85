//! Routes: which destination an event goes to, by its `event_type`.
//!
//! Routes are tried in order and the first whose glob matches wins, so a
//! catch-all `*` belongs last. The relay routes each claimed event here;
//! the claim uses the same globs as SQL `LIKE` patterns only to leave out
//! the rows of a destination that is down, so a difference between the two
//! could cost a wasted claim, never a row sent to the wrong place.

/// An `event_type` pattern: `*` matches any run of characters (dots
/// included, none at all too), `?` exactly one; everything else matches
/// itself, case-sensitively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: Vec<char>,
    text: String,
}

impl Glob {
    /// Parses a pattern; an empty one matches nothing and is refused.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty (use \"*\" for every event type)".to_owned());
        }
        if let Some(c) = raw.chars().find(|c| c.is_control()) {
            return Err(format!("contains the control character {c:?}"));
        }
        Ok(Self {
            pattern: raw.chars().collect(),
            text: raw.to_owned(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `event_type` matches. Linear in practice: a star remembers
    /// where it was, and a mismatch resumes one character further from
    /// there, never from further back.
    pub fn matches(&self, event_type: &str) -> bool {
        // The catch-all of a relay configured by the environment, on every
        // event: no need to look.
        if self.pattern.iter().all(|&c| c == '*') {
            return true;
        }
        let text: Vec<char> = event_type.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            match self.pattern.get(p) {
                Some('*') => {
                    star = Some((p, t));
                    p += 1;
                }
                Some('?') => {
                    p += 1;
                    t += 1;
                }
                Some(&c) if c == text[t] => {
                    p += 1;
                    t += 1;
                }
                _ => match star {
                    Some((star_p, star_t)) => {
                        p = star_p + 1;
                        t = star_t + 1;
                        star = Some((star_p, star_t + 1));
                    }
                    None => return false,
                },
            }
        }
        self.pattern[p..].iter().all(|&c| c == '*')
    }

    /// The same pattern for SQL `LIKE` with its default escape character,
    /// the backslash.
    pub fn like_pattern(&self) -> String {
        let mut like = String::with_capacity(self.text.len());
        for c in &self.pattern {
            match c {
                '*' => like.push('%'),
                '?' => like.push('_'),
                '%' | '_' | '\\' => {
                    like.push('\\');
                    like.push(*c);
                }
                other => like.push(*other),
            }
        }
        like
    }
}

/// One route: events whose type matches go to the destination at
/// `destination` (an index into the relay's destinations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// What `event_type` must match.
    pub event_type: Glob,
    /// Index of the destination.
    pub destination: usize,
}

/// The routes of a relay, in the order they are tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    /// Routes tried in the order given.
    pub fn new(routes: Vec<Route>) -> Self {
        Self { routes }
    }

    /// Every event to destination 0: a relay configured by the environment.
    pub fn everything_to_one() -> Self {
        Self::new(vec![Route {
            event_type: Glob::parse("*").expect("a valid pattern"),
            destination: 0,
        }])
    }

    /// The destination of an event of this type, `None` when no route
    /// matches.
    pub fn route(&self, event_type: &str) -> Option<usize> {
        self.routes
            .iter()
            .find(|route| route.event_type.matches(event_type))
            .map(|route| route.destination)
    }

    /// The routes, in order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(raw: &str) -> Glob {
        Glob::parse(raw).expect("valid pattern")
    }

    #[test]
    fn stars_match_any_run_including_dots_and_nothing() {
        assert!(glob("order.*").matches("order.created"));
        assert!(glob("order.*").matches("order.line.added"));
        assert!(glob("order.*").matches("order."));
        assert!(!glob("order.*").matches("order"));
        assert!(!glob("order.*").matches("orders.created"));
        assert!(glob("*").matches(""));
        assert!(glob("*.created").matches("order.created"));
        assert!(glob("a*b*c").matches("a-b-b-c"));
        assert!(!glob("a*b*c").matches("a-b-b-d"));
        assert!(glob("**x").matches("yyx"));
    }

    #[test]
    fn question_marks_match_one_character_and_text_matches_itself() {
        assert!(glob("v?").matches("v1"));
        assert!(glob("v?").matches("vé"));
        assert!(!glob("v?").matches("v"));
        assert!(!glob("v?").matches("v12"));
        assert!(glob("Order.Created").matches("Order.Created"));
        assert!(!glob("Order.Created").matches("order.created"));
    }

    #[test]
    fn like_patterns_escape_what_like_treats_specially() {
        assert_eq!(glob("order.*").like_pattern(), "order.%");
        assert_eq!(glob("a?_%\\").like_pattern(), "a_\\_\\%\\\\");
    }

    #[test]
    fn empty_patterns_are_refused() {
        assert!(Glob::parse("").is_err());
        assert!(Glob::parse("a\nb").is_err());
    }

    #[test]
    fn the_first_matching_route_wins() {
        let router = Router::new(vec![
            Route {
                event_type: glob("order.cancelled"),
                destination: 2,
            },
            Route {
                event_type: glob("order.*"),
                destination: 0,
            },
            Route {
                event_type: glob("payment.*"),
                destination: 1,
            },
        ]);
        assert_eq!(router.route("order.cancelled"), Some(2));
        assert_eq!(router.route("order.created"), Some(0));
        assert_eq!(router.route("payment.settled"), Some(1));
        assert_eq!(router.route("refund.issued"), None);
        assert_eq!(Router::everything_to_one().route("anything"), Some(0));
    }
}
