//! Address handles ([`AddressHandle`], `ibv_ah`): where a UD QP's datagrams
//! go (IBA 10.2.2.2, 9.8). The destination's MAC is resolved when the handle
//! is made, as rxe does at `ibv_create_ah`; every engine of the device learns
//! the handle under one id ([`Command::CreateAh`]), which UD work requests
//! carry ([`rdma::transport::UdDest`]).

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use rdma::transport::AhId;

use super::VerbsError;
use crate::contract::{Command, CommandTx};
use crate::device::Device;

/// The ids of a device's live address handles: freed ids are reused first,
/// so that the engines' tables stay as long as the most handles ever alive
/// at once, not the number ever made.
#[derive(Debug, Default)]
pub(crate) struct AhIds {
    inner: Mutex<AhIdsInner>,
}

#[derive(Debug, Default)]
struct AhIdsInner {
    /// Ids handed out so far (the next new one is this + 1).
    high: u32,
    free: Vec<u32>,
}

impl AhIds {
    fn take(&self) -> Option<AhId> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let v = match g.free.pop() {
            Some(v) => v,
            None => {
                g.high = g.high.checked_add(1)?;
                g.high
            }
        };
        NonZeroU32::new(v).map(AhId)
    }

    fn give_back(&self, id: AhId) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.free.push(id.0.get());
    }
}

/// An address handle: the destination of UD datagrams, an IPv4 address on
/// this port's network (RoCEv2 GID `::ffff:a.b.c.d`). Dropping it forgets
/// it in the engines; datagrams posted to it and not yet sent are dropped
/// (counted as `tx_drop_no_ah`; UD is unreliable).
pub struct AddressHandle {
    id: AhId,
    ip: [u8; 4],
    mac: [u8; 6],
    cmds: Vec<CommandTx>,
    ids: Arc<AhIds>,
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle")
            .field("id", &self.id)
            .field("ip", &self.ip)
            .field("mac", &self.mac)
            .finish()
    }
}

impl AddressHandle {
    /// Its id, as UD work requests name it ([`rdma::transport::UdDest::ah`]).
    pub fn id(&self) -> AhId {
        self.id
    }

    /// The destination's IPv4 address.
    pub fn ip(&self) -> [u8; 4] {
        self.ip
    }

    /// The next hop's MAC the datagrams go to.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        for c in &self.cmds {
            let _ = c.send(Command::DestroyAh { ah: self.id });
        }
        self.ids.give_back(self.id);
    }
}

impl Device {
    /// Makes an address handle towards `ip` (`ibv_create_ah`): its MAC by
    /// ARP (the kernel's neighbour table in host mode; the port's own for
    /// its own address, whose datagrams loop back inside the NIC), then
    /// every engine learns it. Fails as [`Device::resolve_mac`] does when
    /// the address does not answer.
    pub fn create_ah(&self, ip: [u8; 4]) -> Result<AddressHandle, VerbsError> {
        let mac = if ip == self.ip {
            self.mac
        } else {
            self.resolve_mac(ip)?
        };
        let id = self.ah_ids.take().ok_or(VerbsError::NoAddressHandleLeft)?;
        let mut ah = AddressHandle {
            id,
            ip,
            mac,
            cmds: Vec::with_capacity(self.engines.len()),
            ids: self.ah_ids.clone(),
        };
        for k in 0..self.engines.len() {
            // On a failure, dropping `ah` tells the engines that learnt it.
            self.call(k, |reply| Command::CreateAh {
                ah: id,
                ip,
                mac,
                reply,
            })?;
            ah.cmds.push(self.engines[k].cmd.clone());
        }
        Ok(ah)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_zero_and_reused_after_release() {
        let ids = AhIds::default();
        let a = ids.take().unwrap();
        let b = ids.take().unwrap();
        assert_eq!((a.0.get(), b.0.get()), (1, 2));
        ids.give_back(a);
        assert_eq!(ids.take().unwrap(), a);
        assert_eq!(ids.take().unwrap().0.get(), 3);
    }
}
