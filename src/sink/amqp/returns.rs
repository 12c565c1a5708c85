//! Which row a `basic.return` belongs to.

use std::collections::HashMap;

use lapin::message::BasicReturnMessage;
use lapin::Confirmation;
use uuid::Uuid;

use crate::event::Event;

/// The `basic.return`s of one batch, attributed to rows by message id.
///
/// lapin hands each return to whichever confirmation it resolves next; with
/// many publishes outstanding and acks that confirm several delivery tags at
/// once, that is often another message's confirmation. So a return is never
/// read as news about the confirmation that carries it: every confirmation
/// of the batch is searched, and the returned message's own `message_id`
/// (the event id) names the row it belongs to. RabbitMQ sends a mandatory
/// message's return before its ack, so once every ack of the batch has
/// arrived, every return of the batch is among them.
pub(super) struct Returns {
    /// Event id → why it came back.
    unroutable: HashMap<Uuid, String>,
    /// A return that names no row of this batch, described.
    pub(super) stray: Option<String>,
}

impl Returns {
    /// `handed_back`: returns lapin gave back apart from any confirmation
    /// (`Channel::wait_for_confirms`).
    pub(super) fn collect<'c>(
        confirmations: impl Iterator<Item = &'c Result<Confirmation, lapin::Error>>,
        handed_back: &'c [BasicReturnMessage],
        events: &[Event],
        exchange: &str,
    ) -> Self {
        let mut returns = Self {
            unroutable: HashMap::new(),
            stray: None,
        };
        let carried = confirmations.filter_map(|confirmation| match confirmation {
            Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => Some(returned),
            _ => None,
        });
        for returned in carried.chain(handed_back) {
            let reason = format!(
                "returned by RabbitMQ as unroutable: {} {} (exchange '{exchange}', routing key '{}')",
                returned.reply_code, returned.reply_text, returned.delivery.routing_key
            );
            let message_id = returned
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str());
            let row = message_id
                .and_then(|id| Uuid::parse_str(id).ok())
                // Returns are rare: a search of the batch for each costs
                // less than a set of its ids built for every batch.
                .filter(|id| events.iter().any(|event| event.id == *id));
            match row {
                Some(id) => {
                    returns.unroutable.insert(id, reason);
                }
                None => {
                    returns.stray.get_or_insert_with(|| match message_id {
                        Some(id) => format!("message_id {id}"),
                        None => "no message_id".to_owned(),
                    });
                }
            }
        }
        returns
    }

    pub(super) fn reason_for(&self, event_id: &Uuid) -> Option<&String> {
        self.unroutable.get(event_id)
    }
}
